"""One `dfmp2 run`: molecule -> SCF -> DF-MP2 -> optional PySCF check -> run record."""
from __future__ import annotations

import datetime as dt
import logging
import os
import platform
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import h5py
import numpy as np
import pyscf
import torch
from pyscf import gto

import dfmp2
import kernels
from dfmp2 import mp2
from dfmp2.distributed import World
from dfmp2.checkpoint import Checkpoint, fingerprint, load_resumable, restored_scf
from dfmp2.errors import Dfmp2Error, InputError, RunFailure
from dfmp2.memory import default_budget
from dfmp2.molecule import Geometry, build_molecule, read_xyz, resolve_charge_spin
from dfmp2.record import SCHEMA, Node, is_record_file, write_record
from dfmp2.reference import TOLERANCE, pyscf_dfmp2_energy
from dfmp2.energy import SCS_OS_DEFAULT, SCS_SS_DEFAULT, SOS_OS_DEFAULT
from dfmp2.scf import ScfResult, resolve_reference, run_scf

log = logging.getLogger(__name__)
DEFAULT_OUTPUT_DIR = Path("runs")


@dataclass
class RunSettings:
    molecule: Path
    basis: str = "cc-pvdz"
    auxbasis: str | None = None
    charge: int | None = None
    spin: int | None = None
    frozen_core: bool = False
    frozen: int | None = None
    backend: str = "auto"
    precision: str | None = None
    fused_energy: bool = False
    memory: int | None = None
    scf_method: str = "df"
    reference: str = "auto"
    scs_os: float = SCS_OS_DEFAULT
    scs_ss: float = SCS_SS_DEFAULT
    allow_unconverged: bool = False
    check: bool = False
    output: Path | None = None
    threads: int | None = None
    occ_block: int | None = None
    scratch: Path | None = None
    resume: bool = False
    show_progress: bool | None = None
    command: str = "dfmp2 (python API)"

    def output_path(self) -> Path:
        if self.output is not None:
            return Path(self.output)
        return DEFAULT_OUTPUT_DIR / f"{Path(self.molecule).stem}-{self.basis.lower()}.h5"


@dataclass
class RunOutcome:
    record: Node
    path: Path
    exit_code: int


def check_output_path(path: Path, resume: bool = False) -> None:
    """Refuse, before any work, an output we could not write or would clobber."""
    if path.is_dir():
        raise InputError(f"output {path} is a directory; give a file name such as {path}/run.h5")
    if path.exists() and not is_record_file(path):
        if resume:
            raise InputError(f"cannot resume from {path}: it is not a readable dfmp2 run record")
        raise InputError(f"output {path} exists and is not a dfmp2 run record; "
                         "choose another -o path")
    parent = path.parent if str(path.parent) else Path(".")
    if parent == DEFAULT_OUTPUT_DIR and not parent.exists():
        parent.mkdir(parents=True, exist_ok=True)
    if not parent.is_dir():
        raise InputError(f"output folder {parent} does not exist; create it or choose another -o")
    try:
        probe_fd, probe = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".probe", dir=parent)
    except OSError:
        raise InputError(f"output folder {parent} is not writable; choose another -o") from None
    os.close(probe_fd)
    os.unlink(probe)


def apply_threads(threads: int | None) -> int:
    """Use ``threads`` (default: every core available to us) in torch and PySCF alike."""
    count = threads if threads else len(os.sched_getaffinity(0))
    if count < 1:
        raise InputError("--threads must be at least 1")
    torch.set_num_threads(count)
    pyscf.lib.num_threads(count)
    return count


def versions() -> dict[str, str]:
    return {"dfmp2": dfmp2.__version__, "pyscf": pyscf.__version__, "torch": str(torch.__version__),
            "numpy": np.__version__, "h5py": h5py.__version__,
            "python": platform.python_version()}


@dataclass
class Environment:
    """What a job resolves once: the kernel set, memory budget, threads and scratch folder."""

    kern: object
    budget: int
    threads: int
    scratch_dir: Path
    world: World = field(default_factory=World)


def resolve_environment(settings: RunSettings, path: Path,
                        world: World | None = None) -> Environment:
    try:
        kern = kernels.load(settings.backend, settings.precision or "fp64")
    except ValueError as exc:
        raise InputError(str(exc)) from None
    if settings.precision == "fp64" and kern.precision != "fp64":
        raise InputError(f"the {kern.backend} backend computes in {kern.precision} only; "
                         "drop --precision fp64 or use --backend torch")
    scratch_dir = Path(settings.scratch) if settings.scratch else path.parent
    if not scratch_dir.is_dir() or not os.access(scratch_dir, os.W_OK | os.X_OK):
        raise InputError(f"scratch folder {scratch_dir} is not a writable folder; "
                         "choose another with --scratch")
    threads = apply_threads(settings.threads)
    budget = settings.memory if settings.memory is not None else default_budget()
    return Environment(kern, budget, threads, scratch_dir, world or World())


@dataclass
class Calculation:
    """One molecule (ghost atoms allowed) with its resolved charge, spin and options."""

    mol: gto.Mole
    reference: str
    auxbasis: str | dict
    nfrozen: int
    inputs: dict


def prepare(geometry: Geometry, settings: RunSettings, env: Environment, charge: int | None,
            spin: int | None, ghosts: frozenset[int] = frozenset()) -> Calculation:
    charge, spin = resolve_charge_spin(geometry, charge, spin, ghosts)
    mol = build_molecule(geometry, settings.basis, charge, spin, ghosts)
    reference = resolve_reference(settings.reference, spin)
    auxbasis = settings.auxbasis or mp2.default_auxbasis(mol)
    mp2.make_auxmol(mol, auxbasis)
    if settings.frozen_core and settings.frozen is not None:
        raise InputError("give either --frozen-core or --frozen N, not both")
    nfrozen = mp2.frozen_core_count(mol) if settings.frozen_core else (settings.frozen or 0)
    inputs = {"xyz": geometry.text, "source": str(settings.molecule), "basis": settings.basis,
              "auxbasis": mp2.auxbasis_name(auxbasis), "charge": charge, "spin": spin,
              "ghost_atoms": sorted(ghosts), "scf": settings.scf_method, "reference": reference,
              "frozen": nfrozen, "memory_bytes": env.budget, "threads": env.threads,
              "scratch": str(env.scratch_dir), "backend": env.kern.backend,
              "precision": env.kern.precision, "fused_energy": settings.fused_energy}
    return Calculation(mol, reference, auxbasis, nfrozen, inputs)


def compute(calc: Calculation, settings: RunSettings, env: Environment, node: Node,
            checkpoint: Checkpoint | None = None,
            previous: Node | None = None) -> tuple[ScfResult, mp2.Mp2Result]:
    """SCF and DF-MP2 of one calculation into ``node`` (groups scf, sizes, plan, mp2, timings).

    With a checkpoint the SCF and each finished block pair are saved as they complete, and the
    ones in ``previous`` are reused instead of recomputed.
    """
    world = env.world
    timings = node.group("timings")
    t0 = time.perf_counter()
    scf_result = None
    if world.is_root:
        scf_result = (restored_scf(previous, calc.mol, settings.scf_method, calc.reference)
                      if previous else None)
        node.attrs["resumed"] = scf_result is not None
        if scf_result is None:
            scf_result = run_scf(calc.mol, settings.scf_method, calc.reference)
    scf_result = share_scf(world, scf_result)
    timings.attrs["scf"] = time.perf_counter() - t0
    scf_group = node.group("scf")
    scf_group.attrs.update({"e_tot": scf_result.e_tot, "converged": scf_result.converged,
                            "cycles": scf_result.cycles, "method": scf_result.method,
                            "reference": calc.reference,
                            "jk_auxbasis": scf_result.jk_auxbasis or "none"})
    scf_group.datasets.update({"mo_energy": scf_result.mo_energy, "mo_occ": scf_result.mo_occ,
                               "mo_coeff": scf_result.mo_coeff})
    if not scf_result.converged and not settings.allow_unconverged:
        raise RunFailure(f"the SCF did not converge in {scf_result.cycles} cycles; "
                         "rerun with --allow-unconverged to accept it")
    resume = {}
    if checkpoint is not None and world.is_root:
        checkpoint.save()
        resume = {"on_pair": checkpoint.add_pair,
                  "on_plan": lambda plan: checkpoint.set_plan(plan.occ_block)}
    finished, stored_block = world.broadcast(
        (checkpoint.pairs, checkpoint.occ_block) if checkpoint is not None else ({}, None),
        "sharing the checkpoint")
    occ_block = settings.occ_block or stored_block
    rank_log: dict = {}

    t0 = time.perf_counter()
    result = mp2.kernel(calc.mol, scf_result.mo_energy, scf_result.mo_coeff, scf_result.mo_occ,
                        calc.nfrozen, calc.auxbasis, env.kern, env.budget,
                        settings.fused_energy, occ_block, settings.show_progress,
                        env.scratch_dir, finished=finished, world=world, rank_log=rank_log,
                        **resume)
    timings.attrs["mp2"] = time.perf_counter() - t0
    timings.attrs.update(result.timings)
    sizes = {"nao": result.nao, "naux": result.naux, "naux_fit": result.naux_fit,
             "nocc": result.nocc[0], "nvir": result.nvir[0], "nfrozen": result.nfrozen,
             "natoms": calc.mol.natm}
    if result.open_shell:
        sizes.update({"nocc_beta": result.nocc[1], "nvir_beta": result.nvir[1]})
    node.group("sizes").attrs.update(sizes)
    node.group("plan").attrs.update(result.plan.as_attrs())
    node.group("plan").attrs["metric"] = result.metric_kind
    node.group("mp2").attrs.update(mp2_attrs(result.energies, scf_result.e_tot, settings))
    if world.size > 1:
        distributed = node.group("distributed")
        distributed.attrs.update({"world_size": world.size, "backend": world.backend})
        for name, entry in rank_log.items():
            distributed.attrs[f"{name}.pairs"] = entry["pairs"]
            distributed.attrs[f"{name}.seconds"] = entry["seconds"]
    return scf_result, result


def share_scf(world: World, scf_result: ScfResult | None) -> ScfResult:
    """Rank 0's SCF on every rank (the others get the orbitals, not the PySCF object)."""
    if world.size == 1:
        return scf_result
    fields = world.broadcast(None if scf_result is None else (
        scf_result.e_tot, scf_result.converged, scf_result.cycles, scf_result.mo_energy,
        scf_result.mo_coeff, scf_result.mo_occ, scf_result.method, scf_result.jk_auxbasis,
        scf_result.reference), "sharing the SCF orbitals")
    if scf_result is not None:
        return scf_result
    e_tot, converged, cycles, mo_energy, mo_coeff, mo_occ, method, jk, reference = fields
    return ScfResult(e_tot, converged, cycles, mo_energy, mo_coeff, mo_occ, method, jk, None,
                     reference)


def new_record(settings: RunSettings, env: Environment, schema: str = SCHEMA) -> Node:
    root = Node(attrs={"schema": schema, "status": "running",
                       "created": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
                       "command": settings.command})
    root.group("versions").attrs.update(versions())
    root.group("backend").attrs.update({"backend": env.kern.backend,
                                        "precision": env.kern.precision,
                                        "device": str(env.kern.device),
                                        "fused_energy": settings.fused_energy})
    return root


def run(settings: RunSettings, world: World | None = None) -> RunOutcome:
    """The whole job; the record is checkpointed after the SCF and after every block pair, and
    a run restarted on the same record skips both. With a ``world`` of several ranks, rank 0
    alone writes the record."""
    t_start = time.perf_counter()
    world = world or World()
    path = settings.output_path()
    check_output_path(path, settings.resume)
    geometry = read_xyz(settings.molecule)
    env = resolve_environment(settings, path, world)
    calc = prepare(geometry, settings, env, settings.charge, settings.spin)
    previous = (load_resumable(path, fingerprint(calc.inputs), settings.resume)
                if world.is_root else None)
    root = new_record(settings, env)
    root.group("input").attrs.update(calc.inputs)
    checkpoint = Checkpoint(path, root, previous) if world.is_root else None
    try:
        scf_result, _ = compute(calc, settings, env, root, checkpoint, previous)
    except RunFailure as exc:
        if world.is_root:
            finish_record(root, path, "failed", t_start, env.kern, error=str(exc))
        raise RunFailure(f"{exc} (record {path})") from None
    if not world.is_root:
        return RunOutcome(root, path, 0)

    exit_code = 0
    if settings.check:
        energies = root.groups["mp2"].attrs
        reference = pyscf_dfmp2_energy(scf_result.mf, calc.nfrozen, calc.auxbasis)
        tolerance = TOLERANCE[env.kern.precision]
        delta = energies["e_corr"] - reference.e_corr
        passed = abs(delta) <= tolerance
        root.group("reference").attrs.update({
            "program": f"pyscf {pyscf.__version__} DFMP2/DFUMP2 (with_t2=False)",
            "e_corr": reference.e_corr, "e_os": reference.e_os, "e_ss": reference.e_ss,
            "e_tot": scf_result.e_tot + reference.e_corr, "delta_e_corr": delta,
            "tolerance": tolerance, "passed": passed, "seconds": reference.seconds})
        root.group("timings").attrs["reference"] = reference.seconds
        exit_code = 0 if passed else 1
    finish_record(root, path, "complete", t_start, env.kern)
    return RunOutcome(root, path, exit_code)


def mp2_attrs(energies, e_scf: float, settings: RunSettings) -> dict[str, float]:
    """The /mp2 group: MP2, SCS-MP2 (with its scale factors) and SOS-MP2 (1.3 E_OS)."""
    e_scs = energies.e_scs(settings.scs_os, settings.scs_ss)
    return {"e_corr": energies.e_corr, "e_os": energies.e_os, "e_ss": energies.e_ss,
            "e_scs": e_scs, "e_sos": energies.e_sos(), "e_tot": e_scf + energies.e_corr,
            "e_tot_scs": e_scf + e_scs, "e_tot_sos": e_scf + energies.e_sos(),
            "scs_os_scale": settings.scs_os, "scs_ss_scale": settings.scs_ss,
            "sos_os_scale": SOS_OS_DEFAULT, **energies.components}


def finish_record(root: Node, path: Path, status: str, t_start: float, kern,
            error: str | None = None) -> None:
    root.attrs["status"] = status
    if error:
        root.attrs["error"] = error
    backend = root.group("backend")
    backend.attrs["fallbacks"] = kern.accounting.fallbacks
    backend.attrs["fallback_reasons"] = kern.accounting.fallback_reasons
    backend.attrs["executors"] = kern.accounting.executors()
    backend.attrs.update(kern.accounting.as_attrs())
    backend.attrs.update(kern.report())
    root.group("timings").attrs["total"] = time.perf_counter() - t_start
    try:
        write_record(path, root)
    except OSError as exc:
        raise RunFailure(f"cannot write the run record {path}: {exc.strerror or exc}") from None


def json_summary(outcome: RunOutcome) -> dict:
    root = outcome.record
    mp2_attrs, scf_attrs = root.groups["mp2"].attrs, root.groups["scf"].attrs
    summary = {"e_scf": scf_attrs["e_tot"], "e_corr": mp2_attrs["e_corr"],
               "e_os": mp2_attrs["e_os"], "e_ss": mp2_attrs["e_ss"],
               "e_scs": mp2_attrs["e_scs"], "e_sos": mp2_attrs["e_sos"],
               "e_tot": mp2_attrs["e_tot"],
               "record": str(outcome.path), "status": root.attrs["status"],
               "backend": root.groups["backend"].attrs["backend"],
               "precision": root.groups["backend"].attrs["precision"],
               "fallbacks": root.groups["backend"].attrs["fallbacks"]}
    if "reference" in root.groups:
        ref = root.groups["reference"].attrs
        summary.update({"reference_e_corr": ref["e_corr"], "delta_e_corr": ref["delta_e_corr"],
                        "check_passed": ref["passed"]})
    return summary


__all__ = ["RunSettings", "RunOutcome", "run", "json_summary", "Dfmp2Error"]
