"""One calculation from options to record: input -> reference -> plan -> MP2 -> record.

:func:`run` is ``dfmp2 run`` (and each molecule of ``dfmp2 batch``); :func:`calculate` is the
SCF and MP2 of one :class:`~dfmp2.input.calculation.Calculation` into one record node, shared with
``dfmp2 interaction``. Each stage is handed what it needs and returns what it made.
"""
from __future__ import annotations

import contextlib
import dataclasses
import logging
import math
import os
import platform
import tempfile
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

import h5py
import numpy as np
import pyscf
import torch

import dfmp2
import kernels
from dfmp2.mp2 import kernel as mp2
from dfmp2.df.store import ScratchArea
from dfmp2.input.calculation import Calculation, CalculationRequest, define_calculation
from dfmp2.records.checkpoint import (RESUME, REUSE, PreviousRun, RecordSaver, examine_previous,
                              resumable_pairs, stored_occ_block)
from dfmp2.system.distributed import World
from dfmp2.grad import kernel as gradient
from dfmp2.mp2.methods import SOS_OS_DEFAULT, method_scales
from dfmp2.mp2.pairs import Mp2Energies, PairLedger
from dfmp2.grad.kernel import GradientResult
from dfmp2.errors import Dfmp2Error, InputError, Interrupted, RunFailure
from dfmp2.input.functionals import resolve_functional
from dfmp2.system.memory import memory_budget
from dfmp2.mp2.plan import plan_blocks
from dfmp2.jobs.check import TOLERANCE, pyscf_dfmp2_energy, pyscf_recipe
from dfmp2.records.tree import (COMPLETE, FAILED, INTERRUPTED, SCHEMA, Node, RecordWriteError,
                                is_record_file, new_record, read_record, set_resumed, set_status,
                                write_record)
from dfmp2.records.sections import (BackendFacts, CalculationInputs, CheckSection,
                                    DoubleHybridSection, GradientSection, Mp2Section, PlanSection,
                                    ScfEngineSection, Sizes, read_inputs, read_scf,
                                    write_distributed, write_gradient, write_kernel_ledger,
                                    write_scf, write_timings)
from dfmp2.records.lock import RecordLock
from dfmp2.system.files import (FILE, check_name_length, existing_kind, link_refusal,
                              refuse_links_named_after)
from dfmp2.scf.reference import (ScfOptions, ScfResult, check_scf_memory, release_integrals,
                       restored_scf, run_scf)
from dfmp2.scf.engine import ScfKernels, scf_kernels
from dfmp2.input.settings import DEFAULT_OUTPUT_DIR, RunSettings
from dfmp2.input.xyz import Geometry, read_xyz

log = logging.getLogger(__name__)
# Tries at the final record write of a failed run before a signal is allowed to stop it.
FINAL_WRITE_ATTEMPTS = 3


@dataclass
class RunOutcome:
    record: Node
    path: Path
    exit_code: int
    reused: bool = False


def check_output_path(path: Path, resume: bool = False) -> None:
    """Refuse, before any work, an output we could not write or would clobber: also a link
    or anything but a regular file at ``path`` (reading a FIFO would wait forever), and a name
    too long for the names dfmp2 derives from it."""
    parent = path.parent if str(path.parent) else Path(".")
    check_name_length(path, parent)
    kind = existing_kind(path)
    if kind == "a directory":
        raise InputError(f"output {path} is a directory; give a file name such as {path}/run.h5")
    if kind == "a symbolic link":
        raise link_refusal(path)
    if kind not in (None, FILE):
        raise InputError(f"output {path} is {kind}, not a regular file; choose another -o")
    if kind == FILE and not is_record_file(path):
        if resume:
            raise InputError(f"cannot resume from {path}: it is not a readable dfmp2 run record")
        raise InputError(f"output {path} exists and is not a dfmp2 run record; "
                         "choose another -o path")
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
    """What a job resolves once: the kernel sets (MP2's and the SCF's), memory budget,
    threads and scratch folder."""

    kernel_set: object
    scf_kernels: ScfKernels
    budget: int
    threads: int
    scratch_dir: Path
    world: World = field(default_factory=World)


def resolve_environment(settings: RunSettings, record_path: Path,
                        world: World | None = None) -> Environment:
    try:
        kernel_set = kernels.load(settings.backend, settings.precision,
                                  nki_mode=settings.nki_mode, require_nki=settings.require_nki)
        scf_kernel_sets = scf_kernels(settings.backend, settings.precision, settings.nki_mode,
                                      settings.require_nki)
    except ValueError as exc:
        raise InputError(str(exc)) from None
    scratch_dir = Path(settings.scratch) if settings.scratch else record_path.parent
    if not scratch_dir.is_dir() or not os.access(scratch_dir, os.W_OK | os.X_OK):
        raise InputError(f"scratch folder {scratch_dir} is not a writable folder; "
                         "choose another with --scratch")
    threads = apply_threads(settings.threads)
    budget = memory_budget(settings.memory)
    return Environment(kernel_set, scf_kernel_sets, budget, threads, scratch_dir,
                       world or World())


def request_of(settings: RunSettings, charge: int | None, spin: int | None,
               ghosts: frozenset[int] = frozenset()) -> CalculationRequest:
    if settings.xc is not None and settings.task == "gradient":
        raise InputError("analytic gradients of double hybrids are not implemented; drop --xc "
                         "for an MP2 (SCS, SOS) gradient")
    return CalculationRequest(basis=settings.basis, auxbasis=settings.auxbasis, ecp=settings.ecp,
                              charge=charge, spin=spin, reference=settings.reference,
                              frozen_core=settings.frozen_core, frozen=settings.frozen,
                              scf_method=settings.scf_method, ghosts=ghosts,
                              functional=resolve_functional(settings.xc, settings.mp2_os,
                                                            settings.mp2_ss),
                              grid=settings.grid)


def check_feasible(calc: Calculation, settings: RunSettings, env: Environment) -> None:
    """Refuse, before the SCF, a budget too small for the SCF, for one MP2 block or for the
    gradient's work blocks (sizes from the electron count: the SCF does not change them)."""
    nao = calc.mol.nao_nr()
    check_scf_memory(nao, calc.reference, env.budget)
    counts = [calc.nocc[0]] if calc.reference == "rhf" else list(calc.nocc)
    sizes = [(n - calc.nfrozen, nao - n) for n in counts]
    itemsize = torch.tensor([], dtype=env.kernel_set.dtype).element_size()
    plan_blocks(sizes, calc.auxbasis_functions(), nao, itemsize, env.budget,
                settings.fused_energy, settings.occ_block,
                force_out_of_core=env.world.size > 1)
    if settings.task in ("gradient", "optimize"):
        gradient.check_budget(max(n for n, _ in sizes), max(v for _, v in sizes),
                              calc.auxbasis_functions(), nao, env.budget)


def run_inputs(calc: Calculation, settings: RunSettings, env: Environment) -> CalculationInputs:
    return replace(calc.inputs(str(settings.molecule)), backend=env.kernel_set.backend,
                   precision=env.kernel_set.precision, fused_energy=settings.fused_energy,
                   scf_engine=settings.scf_engine if calc.scf_method == "df" else "pyscf",
                   task=settings.task, method=settings.method,
                   scs_os=settings.scs_os, scs_ss=settings.scs_ss,
                   allow_unconverged=settings.allow_unconverged, check=settings.check,
                   memory_bytes=env.budget, threads=env.threads, scratch=str(env.scratch_dir))


def new_run_record(settings: RunSettings, env: Environment, schema: str = SCHEMA) -> Node:
    root = new_record(schema, settings.command, versions())
    BackendFacts(env.kernel_set.backend, env.kernel_set.precision, str(env.kernel_set.device),
                 settings.fused_energy).write(root)
    return root


@dataclass(frozen=True)
class CalculationOutcome:
    scf: ScfResult
    mp2: mp2.Mp2Result


def obtain_reference(calc: Calculation, env: Environment, settings: RunSettings,
                     scratch: ScratchArea, previous: Node | None,
                     keep_integrals: bool = False) -> ScfResult:
    """Rank 0's SCF (restored from an interrupted run's record when there is one) on every
    rank; the other ranks get the orbitals, not the PySCF object."""
    world = env.world
    options = ScfOptions(settings.scf_engine, env.scf_kernels, env.budget, scratch,
                         keep_integrals, stability=settings.stability)
    result = None
    if world.is_root:
        stored = read_scf(previous) if previous is not None else None
        if stored is not None and stored[1] is not None:
            result = restored_scf(calc, stored[0], stored[1], options)
        else:
            result = run_scf(calc, options)
    if world.size == 1:
        return result
    section, orbitals = world.broadcast(None if result is None else
                                        (result.section, result.orbitals),
                                        "sharing the SCF orbitals")
    return result if result is not None else ScfResult(section, orbitals)


def reference_stage(calc: Calculation, settings: RunSettings, env: Environment, node: Node,
                    saver: RecordSaver | None, scratch: ScratchArea, previous: Node | None,
                    timings: dict[str, float], keep_integrals: bool = False) -> ScfResult:
    """The SCF into ``node`` (saved when there is a ``saver``); an unconverged SCF is a
    failure unless allowed."""
    t0 = time.perf_counter()
    scf_result = obtain_reference(calc, env, settings, scratch, previous, keep_integrals)
    timings["scf"] = time.perf_counter() - t0
    set_resumed(node, previous is not None)
    write_scf(node, scf_result.section, scf_result.orbitals)
    if scf_result.engine is not None:
        scf_result.engine.write(node)
        ledger = env.scf_kernels.accounting
        write_kernel_ledger(node, dict(ledger.calls), ledger.fallbacks,
                            list(ledger.fallback_reasons), env.scf_kernels.fast.report(),
                            ScfEngineSection.group_name)
    write_timings(node, timings)
    if saver is not None and env.world.is_root:
        saver.save()
    if not scf_result.converged and not settings.allow_unconverged:
        raise RunFailure(f"the SCF did not converge in {scf_result.section.cycles} cycles; "
                         "rerun with --allow-unconverged to accept it")
    return scf_result


def mp2_stage(calc: Calculation, settings: RunSettings, env: Environment, node: Node,
              saver: RecordSaver | None, scratch: ScratchArea, previous: Node | None,
              scf_result: ScfResult, timings: dict[str, float]) -> mp2.Mp2Result:
    """The block plan (made once, reconciled with the checkpoint) and the MP2 stage into
    ``node``, each finished block pair saved when there is a ``saver``."""
    world = env.world
    t_mp2 = time.perf_counter()
    orbitals = mp2.Orbitals(scf_result.orbitals.mo_energy, scf_result.orbitals.mo_coeff,
                            scf_result.orbitals.mo_occ, calc.nfrozen)
    fit = mp2.fit_basis(calc.mol, calc.auxbasis)
    timings["metric"] = time.perf_counter() - t_mp2
    plan = finished = None
    if world.is_root:
        plan = mp2.plan_for(orbitals, fit, calc.mol.nao_nr(), env.kernel_set, env.budget,
                            settings.fused_energy,
                            settings.occ_block or stored_occ_block(previous), world.size)
        finished = resumable_pairs(previous, plan)
    plan, finished = world.broadcast((plan, finished), "sharing the block plan")
    ledger = PairLedger(finished)
    if saver is not None and world.is_root:
        saver.start_pairs(plan.occ_block, finished)
        ledger.on_finish = saver.add_pair
    result = mp2.kernel(calc.mol, orbitals, fit, env.kernel_set, plan,
                        mp2.Execution(world, scratch, ledger, settings.show_progress))
    timings["mp2"] = time.perf_counter() - t_mp2
    timings.update(result.timings)
    write_timings(node, timings)
    nocc, nvir = result.nocc, result.nvir
    Sizes(result.nao, result.naux, result.naux_fit, nocc[0], nvir[0], result.nfrozen,
          calc.mol.natm, *((nocc[1], nvir[1]) if result.open_shell else ())).write(node)
    PlanSection(plan.occ_block, plan.nblocks, plan.out_of_core, plan.b_bytes, plan.energy_bytes,
                plan.build_block_bytes, plan.budget, result.metric_kind).write(node)
    mp2_section(result.energies, scf_result.e_tot, settings).write(node)
    if calc.functional is not None:
        double_hybrid_section(calc, scf_result, result.energies).write(node)
    if world.size > 1:
        write_distributed(node, world.size, world.backend, result.ranks)
    return result


def calculate(calc: Calculation, settings: RunSettings, env: Environment, node: Node,
              saver: RecordSaver | None, scratch: ScratchArea,
              previous: Node | None = None) -> CalculationOutcome:
    """SCF and DF-MP2 of one calculation into ``node``. With a ``saver`` the record is saved
    after the SCF and after every block pair, and the work of ``previous`` (an interrupted
    run) is reused instead of recomputed."""
    timings: dict[str, float] = {}
    scf_result = reference_stage(calc, settings, env, node, saver, scratch, previous, timings)
    result = mp2_stage(calc, settings, env, node, saver, scratch, previous, scf_result,
                       timings)
    return CalculationOutcome(scf_result, result)


def differentiate(calc: Calculation, settings: RunSettings, env: Environment, mf,
                  scratch: ScratchArea) -> GradientResult:
    """The relaxed gradient of the chosen method on the converged SCF ``mf``, within the
    run's memory budget (its large tensors in ``scratch`` when they do not fit)."""
    return gradient.kernel(mf, calc.nfrozen, calc.auxbasis, calc.jk_auxbasis, env.kernel_set,
                           method_scales(settings.method, settings.scs_os, settings.scs_ss),
                           settings.occ_block, env.budget, scratch)


def gradient_stage(calc: Calculation, settings: RunSettings, env: Environment, node: Node,
                   scf_result: ScfResult, scratch: ScratchArea,
                   timings: dict[str, float]) -> GradientResult:
    """The relaxed DF-MP2 gradient of the chosen method into ``node``, with the MP2 energies
    it computed on the way."""
    t0 = time.perf_counter()
    try:
        result = differentiate(calc, settings, env, scf_result.mf, scratch)
    finally:
        release_integrals(scf_result.mf)
    timings["gradient"] = time.perf_counter() - t0
    timings.update({f"gradient_{k}": v for k, v in result.timings.items()})
    write_timings(node, timings)
    energies = Mp2Energies(result.e_os, result.e_ss)
    mp2_section(energies, result.e_scf, settings).write(node)
    if not np.all(np.isfinite(result.gradient)):
        raise RunFailure(f"the {settings.method} gradient overflowed to non-finite numbers; "
                         "give --scs-os/--scs-ss values of an ordinary size")
    write_gradient(node, GradientSection(settings.method, result.e_tot, *result.scales,
                                         result.jk_builds,
                                         tensors="scratch" if result.out_of_core else "memory",
                                         response_solver=result.response.solver,
                                         response_iterations=result.response.iterations,
                                         response_residual=result.response.residual),
                   result.gradient)
    return result


def mp2_section(energies: Mp2Energies, e_scf: float, settings: RunSettings) -> Mp2Section:
    """MP2, SCS-MP2 (with its scale factors) and SOS-MP2 (1.3 E_OS)."""
    e_scs = energies.e_scs(settings.scs_os, settings.scs_ss)
    return finite(Mp2Section(energies.e_corr, energies.e_os, energies.e_ss, e_scs,
                             energies.e_sos(), e_scf + energies.e_corr, e_scf + e_scs,
                             e_scf + energies.e_sos(), settings.scs_os, settings.scs_ss,
                             SOS_OS_DEFAULT, **energies.components),
                  "--scs-os/--scs-ss")


def finite(section, scales: str):
    """``section`` when every number in it is finite. Finite options can still overflow in a
    product (``--scs-os 1.7e308``), and neither the record nor ``--json`` can hold the
    result, so it is a failure that names the options to blame."""
    bad = [name for name, value in dataclasses.asdict(section).items()
           if isinstance(value, float) and not math.isfinite(value)]
    if bad:
        raise RunFailure(f"{', '.join(bad)} overflowed to a non-finite number; give {scales} "
                         "values of an ordinary size")
    return section


def double_hybrid_section(calc: Calculation, scf_result: ScfResult,
                          energies: Mp2Energies) -> DoubleHybridSection:
    functional, scf = calc.functional, scf_result.section
    return finite(DoubleHybridSection(functional.name, functional.xc, functional.os_scale,
                                      functional.ss_scale, functional.source, scf.grid_level,
                                      scf.grid_points, scf.e_tot,
                                      functional.pt2(energies.e_os, energies.e_ss),
                                      functional.total(scf.e_tot, energies.e_os,
                                                       energies.e_ss)),
                  "--mp2-os/--mp2-ss")


def run_check(calc: Calculation, outcome: CalculationOutcome, precision: str,
              node: Node) -> bool:
    """``--check``: PySCF's DF-MP2 on the same orbitals, auxiliary basis and frozen core; for
    a double hybrid, PySCF's whole recipe (its own Kohn-Sham SCF with the same functional
    and grid, its DF-MP2, scaled), compared on the total energy too."""
    if calc.functional is not None:
        return _check_recipe(calc, outcome, precision, node)
    reference = pyscf_dfmp2_energy(outcome.scf.mf, calc.nfrozen, calc.auxbasis.spec)
    tolerance = TOLERANCE[precision]
    delta = outcome.mp2.energies.e_corr - reference.e_corr
    passed = abs(delta) <= tolerance
    CheckSection(f"pyscf {pyscf.__version__} DFMP2/DFUMP2 (with_t2=False)", reference.e_corr,
                 reference.e_os, reference.e_ss, outcome.scf.e_tot + reference.e_corr, delta,
                 tolerance, passed, reference.seconds).write(node)
    write_timings(node, {"reference": reference.seconds})
    return passed


def _check_recipe(calc: Calculation, outcome: CalculationOutcome, precision: str,
                  node: Node) -> bool:
    recipe = pyscf_recipe(calc, "the check")
    energies = outcome.mp2.energies
    e_tot = calc.functional.total(outcome.scf.e_tot, energies.e_os, energies.e_ss)
    tolerance = TOLERANCE[precision]
    delta_corr, delta_tot = energies.e_corr - recipe.mp2.e_corr, e_tot - recipe.e_tot
    passed = abs(delta_corr) <= tolerance and abs(delta_tot) <= tolerance
    CheckSection(f"pyscf {pyscf.__version__} DF-{calc.reference_name.upper()} "
                 f"({calc.functional.xc}) then DFMP2/DFUMP2, scaled", recipe.mp2.e_corr,
                 recipe.mp2.e_os, recipe.mp2.e_ss, recipe.e_tot, delta_corr, tolerance, passed,
                 recipe.seconds, recipe.e_scf, delta_tot).write(node)
    write_timings(node, {"reference": recipe.seconds})
    return passed


class RecordSession:
    """A record this process writes: locked for the whole run, saved as it goes, and ended
    ``complete``, ``failed`` or ``interrupted`` whatever happens, with no temporary file left.
    On ranks other than 0 it only runs the body."""

    def __init__(self, path: Path, env: Environment) -> None:
        self.path, self.env = path, env
        self.lock = RecordLock(path) if env.world.is_root else None
        self.t_start = time.perf_counter()

    def __enter__(self) -> "RecordSession":
        if self.lock is not None:
            self.lock.acquire()
            try:
                refuse_links_named_after(self.path, [self.path.parent, self.env.scratch_dir],
                                         "choose another -o or --scratch")
            except BaseException:
                self.lock.release()
                raise
        return self

    def __exit__(self, *exc) -> None:
        if self.lock is not None:
            self.lock.release()

    def finish(self, root: Node, state: str, error: str | None = None) -> None:
        set_status(root, state, error)
        accounting = self.env.kernel_set.accounting
        write_kernel_ledger(root, dict(accounting.calls), accounting.fallbacks,
                            list(accounting.fallback_reasons), self.env.kernel_set.report())
        write_timings(root, {"total": time.perf_counter() - self.t_start})
        if self.env.world.is_root:
            write_record(self.path, root)

    def fail(self, root: Node, exc: BaseException) -> str | None:
        """End the record after ``exc``. When the full record cannot be written (a full disk),
        a small one that still says what happened is tried; returns why neither could be."""
        state = INTERRUPTED if isinstance(exc, Interrupted) else FAILED
        text = str(exc) if isinstance(exc, Dfmp2Error) else f"internal error: {exc!r}"
        try:
            self._finish_despite_signals(root, state, text)
        except RecordWriteError:
            try:
                self.finish(without_datasets(root), state, text)
            except Dfmp2Error as write_error:
                return str(write_error)
        except Dfmp2Error as write_error:
            return str(write_error)
        return None

    def _finish_despite_signals(self, root: Node, state: str, error: str) -> None:
        """End the record with everything it holds, even when a signal interrupts the write
        (torchrun's SIGTERM to the ranks left after one died, a second Ctrl-C): the run is
        stopping anyway, and a smaller record would lose finished work."""
        for _ in range(FINAL_WRITE_ATTEMPTS - 1):
            try:
                self.finish(root, state, error)
                return
            except Interrupted:
                log.info("a signal interrupted the final record write; writing it again")
        self.finish(root, state, error)


def without_datasets(node: Node) -> Node:
    """The record's attributes alone: what was run and how it ended, without the orbitals."""
    return Node(attrs=dict(node.attrs),
                groups={name: without_datasets(child) for name, child in node.groups.items()})


def guarded(session: RecordSession, root: Node, work):
    """Run ``work()``; any failure ends the record as failed (or interrupted) before it is
    raised again, with the record's path in the message of user-facing errors."""
    try:
        return work()
    except MemoryError:
        error = RunFailure("out of memory; lower --memory so that dfmp2 plans for less, or "
                           "use a machine with more")
        raise RunFailure(f"{error}{_record_note(session, root, error)}") from None
    except Dfmp2Error as exc:
        exc.args = (f"{exc}{_record_note(session, root, exc)}",)
        raise
    except BaseException as exc:
        session.fail(root, exc)
        raise


def _record_note(session: RecordSession, root: Node, exc: Dfmp2Error) -> str:
    """`` (record PATH)``, or why the record could not say what happened."""
    unwritten = session.fail(root, exc)
    if unwritten is None:
        return f" (record {session.path})"
    if isinstance(exc, RecordWriteError):
        return ""
    return f" (record {session.path} not updated: {unwritten})"


def run(settings: RunSettings, world: World | None = None, reuse_complete: bool = False,
        geometry: Geometry | None = None, ghosts: frozenset[int] = frozenset()) -> RunOutcome:
    """The whole job. The record is checkpointed after the SCF and after every block pair, and
    a run restarted on the same record skips both. With a ``world`` of several ranks, rank 0
    alone writes the record. With ``reuse_complete`` a complete record of the same inputs is
    returned as it is (``batch`` reruns). The molecule is ``geometry`` when given (QCSchema,
    ASE), with ``ghosts`` as ghost atoms, else the XYZ file ``settings.molecule``."""
    world = world or World()
    path = settings.output_path()
    check_output_path(path, settings.resume)
    geometry = geometry if geometry is not None else read_xyz(settings.molecule)
    env = resolve_environment(settings, path, world)
    calc = define_calculation(geometry, request_of(settings, settings.charge, settings.spin,
                                                   ghosts))
    check_feasible(calc, settings, env)
    inputs = run_inputs(calc, settings, env)
    with RecordSession(path, env) as session:
        previous = PreviousRun("fresh")
        if world.is_root:
            previous = examine_previous(path, SCHEMA, inputs, settings.resume, reuse_complete)
        action = world.broadcast(previous.action, "sharing the resume decision")
        if action == REUSE:
            return RunOutcome(previous.record, path, 0, reused=True)
        root = new_run_record(settings, env)
        inputs.write(root)
        saver = RecordSaver(path, root) if world.is_root else None
        scratch = ScratchArea(env.scratch_dir, f"{path.name}.run")
        resumed_from = previous.record if action == RESUME else None

        def work() -> int:
            if saver is not None:
                saver.save()
            if settings.task == "gradient":
                timings: dict[str, float] = {}
                scf_result = reference_stage(calc, settings, env, root, saver, scratch,
                                             resumed_from, timings, keep_integrals=True)
                gradient_stage(calc, settings, env, root, scf_result, scratch, timings)
                session.finish(root, COMPLETE)
                return 0
            outcome = calculate(calc, settings, env, root, saver, scratch, resumed_from)
            passed = True
            if settings.check and world.is_root:
                passed = run_check(calc, outcome, env.kernel_set.precision, root)
            session.finish(root, COMPLETE)
            return 0 if passed else 1

        exit_code = guarded(session, root, work)
        if previous.superseded is not None and world.is_root:
            drop_identical_copy(previous.superseded, inputs)
    return RunOutcome(root, path, exit_code)


def drop_identical_copy(superseded: Path, inputs: CalculationInputs) -> None:
    """The set-aside complete record is redundant once a run of the same inputs completed."""
    with contextlib.suppress(Dfmp2Error, OSError):
        stored = read_inputs(read_record(superseded))
        if stored is not None and not stored.differing(inputs, CalculationInputs.REUSE_FIELDS):
            superseded.unlink()
            log.info("removed %s: the new record holds the same calculation", superseded)
