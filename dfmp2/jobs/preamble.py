"""What every job does before its first calculation, written once: the output checked, the
molecule read, the environment resolved (kernel sets, budget, threads, scratch), each
calculation defined, its block plan made (which refuses a hopeless budget before the SCF), and
its inputs as the record will hold them.

``dfmp2 run`` (:mod:`dfmp2.jobs.run`), ``interaction`` and ``optimize`` start with
:func:`start_job` and take what they need from the :class:`Job`.
"""
from __future__ import annotations

import errno
import hashlib
import json
import logging
import os
import platform
import tempfile
from dataclasses import dataclass, field, replace
from pathlib import Path

import h5py
import numpy as np
import pyscf
import torch
from threadpoolctl import threadpool_limits

import dfmp2
import kernels
from kernels.nki.launcher import NkiUnavailable
from dfmp2.entry import openmp_thread_counts
from dfmp2.errors import InputError
from dfmp2.grad import kernel as gradient
from dfmp2.input.calculation import Calculation, CalculationRequest, define_calculation
from dfmp2.input.functionals import resolve_functional
from dfmp2.input.settings import DEFAULT_OUTPUT_DIR, RunSettings
from dfmp2.input.xyz import Geometry, names_standard_input, read_xyz
from dfmp2.mp2.kernel import plan_for
from dfmp2.mp2.plan import BlockPlan
from dfmp2.records.sections import CalculationInputs
from dfmp2.records.ledger import BackendFacts
from dfmp2.records.tree import SCHEMA, Node, new_record, record_problem
from dfmp2.scf.engine import ScfKernels, scf_kernels
from dfmp2.scf.reference import check_scf_memory
from dfmp2.system.distributed import World, launch_from
from dfmp2.system.files import (FILE, can_create_files_in, check_name_length, create_folder,
                                existing_kind, is_empty_file, link_refusal)
from dfmp2.system.limits import cpu_quota_cores
from dfmp2.system.memory import memory_budget

log = logging.getLogger(__name__)
# Why no file can be made anywhere on a file system or in this process, not in one folder: a
# full disk or inode table, a quota, the open-file limits.
RESOURCE_ERRORS = (errno.ENOSPC, errno.EDQUOT, errno.EMFILE, errno.ENFILE)


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
    # An empty file (a job script's mktemp) holds nothing to replace or resume.
    problem = record_problem(path) if kind == FILE and not is_empty_file(path) else None
    if problem is not None:
        if resume:
            raise InputError(f"cannot resume from {path}: it is not a readable dfmp2 run record "
                             f"({problem})")
        raise InputError(f"output {path} exists and is not a dfmp2 run record this run can "
                         f"replace ({problem}); choose another -o path")
    if parent == DEFAULT_OUTPUT_DIR and not parent.exists():
        create_folder(parent, "choose another -o")
    if not parent.is_dir():
        raise InputError(f"output folder {parent} does not exist; create it or choose another -o")
    if not can_create_files_in(parent, f".{path.name}."):
        raise InputError(f"output folder {parent} is not writable; choose another -o")


def apply_threads(threads: int | None) -> int:
    """Use ``threads`` in torch and PySCF alike, at most one per core: more only wait for
    each other, and a count such as 100000 made OpenMP fail to allocate its pool and end the
    process. Without ``threads``: OMP_NUM_THREADS when it is set (a job script's share of a
    node; torchrun sets 1 for each of several ranks), else every core available to us.
    Before, every core was taken whatever OMP_NUM_THREADS said: two ranks on two cores ran
    two threads each. The cores available are those of the CPU affinity mask, at most the
    whole CPUs of a control group's CPU quota (a container's limit, which the mask does not
    show: more threads than it allows are throttled)."""
    cores = usable_cores()
    count = threads if threads else min(cores, openmp_threads() or cores)
    if count < 1:
        raise InputError("--threads must be at least 1")
    if count > cores:
        log.warning("--threads %d is more than the %d cores this process may use; using %d",
                    count, cores, cores)
        count = cores
    torch.set_num_threads(count)
    pyscf.lib.num_threads(count)
    # numpy's and scipy's BLAS too (PySCF's driver, the metric's factor): with --threads 1
    # they took every core, and a run's bits followed OMP_NUM_THREADS (1.6e-10 Eh, (H2O)8).
    threadpool_limits(limits=count, user_api="blas")
    return count


def usable_cores() -> int:
    """The cores this process may run on: its affinity mask's, within its CPU quota."""
    cores = len(os.sched_getaffinity(0))
    quota = cpu_quota_cores()
    return cores if quota is None else min(cores, quota)


def openmp_threads(environ=os.environ) -> int | None:
    """The outermost thread count of OMP_NUM_THREADS, None when it is unset or one OpenMP
    would reject (the entry point warns of the latter)."""
    counts = openmp_thread_counts(environ.get("OMP_NUM_THREADS", ""))
    return counts[0] if counts else None


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


def check_pyscf_tmpdir() -> None:
    """PySCF opens a file in its temporary folder for every SCF object (dfmp2 removes it at
    once): a folder that is not there ended the SCF in a FileNotFoundError traceback."""
    folder = Path(pyscf.lib.param.TMPDIR)
    if not folder.is_dir() or not os.access(folder, os.W_OK | os.X_OK):
        raise InputError(f"PySCF's temporary folder {folder} (PYSCF_TMPDIR) is not a writable "
                         "folder; set PYSCF_TMPDIR to one, or unset it")


def resolve_environment(settings: RunSettings, record_path: Path,
                        world: World | None = None) -> Environment:
    try:
        kernel_set = kernels.load(settings.backend, settings.precision,
                                  nki_mode=settings.nki_mode, require_nki=settings.require_nki)
        scf_kernel_sets = scf_kernels(settings.backend, settings.precision, settings.nki_mode,
                                      settings.require_nki)
    except ValueError as exc:
        raise InputError(str(exc)) from None
    except NkiUnavailable as exc:
        raise InputError(f"{exc}; set DFMP2_NKI_MODE to an available mode (interpreter runs "
                         "anywhere), or unset it") from None
    if kernel_set.backend != "nki" and (settings.nki_mode or settings.require_nki):
        # They ask for NKI, which --backend did not give: the record says torch, and so
        # does this.
        log.warning("DFMP2_NKI_MODE and DFMP2_REQUIRE_NKI apply to the NKI backend; this run "
                    "uses %s (give --backend nki to run the NKI kernels)", kernel_set.backend)
    scratch_dir = Path(settings.scratch) if settings.scratch else record_path.parent
    if (existing_kind(scratch_dir, follow_links=True) != "a directory"
            or not os.access(scratch_dir, os.W_OK | os.X_OK)):
        raise InputError(f"scratch folder {scratch_dir} is not a writable folder; "
                         "choose another with --scratch")
    try:
        # /proc and /sys pass the access test, and no file can be made in them.
        with tempfile.TemporaryFile(dir=scratch_dir):
            pass
    except OSError as exc:
        if exc.errno in RESOURCE_ERRORS:
            raise InputError(f"no file can be created in the scratch folder {scratch_dir} "
                             f"({exc.strerror}); free some space or raise the limit, or choose "
                             "another with --scratch") from None
        # Any other reason is of tempfile's last try (ENOENT from /proc), not of the folder.
        raise InputError(f"scratch folder {scratch_dir} is not a writable folder: no file can "
                         "be created in it; choose another with --scratch") from None
    check_pyscf_tmpdir()
    threads = apply_threads(settings.threads)
    return Environment(kernel_set, scf_kernel_sets, memory_budget(settings.memory), threads,
                       scratch_dir, world or World())


def request_of(settings: RunSettings, charge: int | None, spin: int | None,
               ghosts: frozenset[int] = frozenset()) -> CalculationRequest:
    if settings.xc is not None and settings.method != "mp2":
        raise InputError(f"--method {settings.method} and --xc do not combine: a double hybrid "
                         "scales its MP2 parts itself (custom scales: --mp2-os, --mp2-ss)")
    return CalculationRequest(basis=settings.basis, auxbasis=settings.auxbasis,
                              jk_auxbasis=settings.jk_auxbasis, ecp=settings.ecp,
                              charge=charge, spin=spin, reference=settings.reference,
                              frozen_core=settings.frozen_core, frozen=settings.frozen,
                              scf_method=settings.scf_method, ghosts=ghosts,
                              functional=resolve_functional(settings.xc, settings.mp2_os,
                                                            settings.mp2_ss,
                                                            settings.dispersion),
                              grid=settings.grid)


def active_sizes(calc: Calculation) -> list[tuple[int, int]]:
    """(active occupied, virtual) per spin channel, from the electron count: the SCF does not
    change them."""
    nao = calc.mol.nao_nr()
    counts = [calc.nocc[0]] if calc.reference == "rhf" else list(calc.nocc)
    return [(n - calc.nfrozen, nao - n) for n in counts]


def make_plan(calc: Calculation, settings: RunSettings, env: Environment,
              occ_block: int | None = None) -> BlockPlan:
    """The MP2 block plan of ``calc`` (``occ_block`` or ``--occ-block`` when given), made before
    the SCF so that a budget too small for the SCF, for one MP2 block or for the gradient's
    work blocks is refused before any work."""
    nao, naux = calc.mol.nao_nr(), calc.auxbasis_functions()
    sizes = active_sizes(calc)
    check_scf_memory(nao, calc.reference, env.budget)
    plan = plan_for(sizes, naux, nao, env.kernel_set, env.budget, settings.fused_energy,
                    occ_block or settings.occ_block, env.world.size)
    if settings.task in ("gradient", "optimize"):
        gradient.check_budget(max(n for n, _ in sizes), max(v for _, v in sizes), naux, nao,
                              env.budget)
    return plan


def run_inputs(calc: Calculation, settings: RunSettings, env: Environment) -> CalculationInputs:
    return replace(calc.inputs(str(settings.molecule)), backend=env.kernel_set.backend,
                   precision=env.kernel_set.precision, fused_energy=settings.fused_energy,
                   scf_engine=settings.scf_engine if calc.scf_method == "df" else "pyscf",
                   task=settings.task, method=settings.method,
                   scs_os=settings.scs_os, scs_ss=settings.scs_ss,
                   allow_unconverged=settings.allow_unconverged, check=settings.check,
                   follow_instability=settings.follow_instability,
                   memory_bytes=env.budget, threads=env.threads, scratch=str(env.scratch_dir))


@dataclass(frozen=True)
class Job:
    """A job after its preamble: the settings, the record's path, the molecule and the
    environment."""

    settings: RunSettings
    path: Path
    geometry: Geometry
    env: Environment
    said: set[str] = field(default_factory=set, compare=False, repr=False)
    """The warnings on the bases said so far: an optimisation's steps, a frequency job's
    points and an interaction's fragments define their calculations again, and each would
    say them again."""

    def calculation(self, charge: int | None, spin: int | None,
                    ghosts: frozenset[int] = frozenset(), geometry: Geometry | None = None,
                    settings: RunSettings | None = None) -> Calculation:
        """One calculation of this job: the job's molecule (or ``geometry``), defined and
        checked."""
        settings = settings or self.settings
        return define_calculation(geometry if geometry is not None else self.geometry,
                                  request_of(settings, charge, spin, ghosts), self.said)

    def new_record(self, schema: str = SCHEMA) -> Node:
        root = new_record(schema, self.settings.command, versions())
        kernel_set = self.env.kernel_set
        BackendFacts(kernel_set.backend, kernel_set.precision, str(kernel_set.device),
                     self.settings.fused_energy).write(root)
        return root


def start_job(settings: RunSettings, path: Path, world: World | None = None,
              geometry: Geometry | None = None) -> Job:
    """The preamble of a job writing the record at ``path``: the output checked, the molecule
    (``geometry``, else the XYZ file of ``settings``) read, the environment resolved."""
    check_output_path(path, settings.resume)
    if geometry is None:
        _refuse_shared_standard_input(settings.molecule, world)
        geometry = read_xyz(settings.molecule)
    env = resolve_environment(settings, path, world)
    agree_across_ranks(settings, geometry, env)
    return Job(settings, path, geometry, env)


def _refuse_shared_standard_input(molecule: Path, world: World | None) -> None:
    """Refuse standard input as the molecule of several ranks: each rank reads the molecule,
    and a launcher gives standard input to the first rank alone (the others found it empty,
    and the first waited for them until the collectives' timeout)."""
    ranks = world.size if world is not None else launch_from(os.environ).size
    if ranks > 1 and names_standard_input(molecule):
        raise InputError(f"{molecule} is standard input, which a launcher gives to the first "
                         f"of the {ranks} ranks alone, while every rank reads the molecule; "
                         "give it as a file")


def agree_across_ranks(settings: RunSettings, geometry: Geometry, env: Environment) -> None:
    """With several ranks (a collective): refuse ranks that were given different calculations,
    and give every rank the smallest budget. Each rank measured its own default budget (free
    memory now), and the blocks that follow from it must be the same on every rank: ranks of
    other budgets, or of another copy of the molecule, ended in a traceback of collectives
    that no longer matched. A default budget is the node's: it is shared by the ranks on the
    node (each took all of it, so 32 ranks on a trn1 node planned 32 times its memory); a
    ``--memory`` is the rank's own."""
    world = env.world
    if world.size == 1:
        return
    budget = env.budget // world.ranks_on_this_node() if settings.memory is None else env.budget
    everyone = world.gather((_calculation_fingerprint(settings, geometry), budget),
                            "checking that every rank runs the same calculation")
    differing = [rank for rank, (fingerprint, _) in enumerate(everyone)
                 if fingerprint != everyone[0][0]]
    if differing:
        # Every rank is here and refuses: the group is left whole, where one left to the
        # process's exit could abort it (a C++ terminate, status -6) while another rank left.
        world.close()
        raise InputError(f"rank {differing[0]} was given another calculation than rank 0 (its "
                         "molecule or options differ); start every rank with the same command "
                         "and the same files")
    env.budget = min(budget for _, budget in everyone)


# Settings a rank may hold on its own: they change neither the numbers nor the work's cut
# (the command line is compared through the settings it gave, the molecule's file through
# the molecule read from it, so that a relative and an absolute path to it agree).
RANK_OWN_SETTINGS = frozenset({"memory", "threads", "show_progress", "nki_mode", "command",
                               "molecule", "output", "scratch"})


def _calculation_fingerprint(settings: RunSettings, geometry: Geometry) -> str:
    digest = hashlib.sha256()
    shared = {name: str(value) for name, value in vars(settings).items()
              if name not in RANK_OWN_SETTINGS}
    digest.update(json.dumps(shared, sort_keys=True).encode())
    digest.update(json.dumps([geometry.symbols, geometry.charge, geometry.multiplicity]).encode())
    digest.update(np.ascontiguousarray(geometry.coords, dtype=np.float64).tobytes())
    return digest.hexdigest()
