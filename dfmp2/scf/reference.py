"""The reference from PySCF: RHF or UHF, converged tightly enough for a 1e-9 Eh stable MP2.

``run``, ``compare`` and ``bench`` all reach their reference through :func:`new_scf`, so they
build the same SCF object for the same calculation (RHF or UHF, the same JK-fit basis, the
same thresholds and memory budget).

Under several ranks (``ScfOptions.world``) every rank runs the same SCF: with our engine its
J/K builds are collective (each rank a slice of the fit functions); PySCF's density fitting
and conventional integrals run whole on every rank, each in its own files.
"""
from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import logging
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import scipy.linalg
from pyscf import df, dft, gto, lib, scf
from pyscf.lib.diis import INCORE_SIZE as DIIS_INCORE_SIZE
from pyscf.soscf import newton_ah

from dfmp2.df.store import ScratchArea
from dfmp2.system.blas_threads import torch_owns_the_cores
from dfmp2.input.calculation import Calculation
from dfmp2.system.disk import check_space
from dfmp2.system.distributed import World
from dfmp2.errors import InputError, RunFailure
from dfmp2.system.memory import (FP64_BYTES, PYSCF_JK_IN_MEMORY_SHARE, format_size,
                                 out_of_memory)
from dfmp2.records.sections import ScfEngineSection, ScfSection, StoredOrbitals
from dfmp2.scf.engine import (KernelDF, PrecisionLadder, ScfKernels, scf_engine_section,
                              use_kernel_engine)
from dfmp2.scf.numint import SharedGridNumInt
from dfmp2.scf.spin import exact_spin_square, spin_contaminated, spin_square

log = logging.getLogger(__name__)
# Inside :func:`reference_warned_once`: the kinds of warning given.
_reference_warned: contextvars.ContextVar[set[str] | None] = contextvars.ContextVar(
    "reference_warned", default=None)

SCF_METHODS = ("df", "conventional")
# Where an SCF object keeps the scratch files it gave PySCF by name.
PINNED_FILES = "_dfmp2_pinned_files"
# conv_tol 1e-10 leaves glycine's DF-MP2 energy 1.4e-8 Eh off the converged value; 1e-12 with a
# 1e-7 orbital-gradient threshold is stable to 1e-9 Eh (measured when the project started).
CONV_TOL = 1e-12
CONV_TOL_GRAD = 1e-7
# The MP2 energy is not variational in the orbitals: it carries the residual orbital gradient
# to first order, and an orbital response (a gradient, a relaxed density) does too. Where that
# matters these orbitals are converged further: at 1e-7 the gradient of linear quartet H3
# moved by 1.6e-8 Eh/Bohr with the ranks' summation order (4e-9 at 1e-8, 1 to 4 more
# cycles), and the E_corr of the CN radical in aug-cc-pVDZ stopped 4.9e-8 Eh from its
# converged value (5e-9 at 1e-8): open shells' soft spin modes carry the residual further.
TIGHT_CONV_TOL_GRAD = 1e-8
# Where the tight threshold cannot be reached, the SCF settles once the orbital gradient has
# stayed below a ceiling for this many cycles of exact builds without halving: an unstable
# UHF sits at a few 1e-8 (NO2 with one bond stretched converged at 1e-7, and at 1e-8 failed
# after 100 cycles).
SETTLE_CYCLES = 6
# ... and with every one of those cycles changing the energy by less than this (Eh): a
# stalled SCF creeps (OF's by 1e-12 Eh a cycle); one still wandering does not settle (a
# sextet Mn atom's B2PLYP SCF, its gradient below the Kohn-Sham ceiling, rose by 7e-8 Eh over
# six cycles).
SETTLE_ENERGY_CHANGE = 1e-9
# The ceiling for Kohn-Sham: its orbital gradient can stall at a floor set by the functional
# on its grid, 2.6e-7 to 4.4e-7 for hydroxyl with B3LYP, B2PLYP and DSD-PBEP86 on grid level 3
# (where a second-order solver makes no further step, PySCF 2.14), 1.1e-6 for OH at 0.97 A and
# 1.2e-6 for OF (2Pi radicals, the hole's flat rotation), 2.5e-6 for OF on grid level 4.
# A Kohn-Sham SCF aims at the Hartree-Fock thresholds: stopped at 1e-6 where 1e-7 could be
# reached, B2PLYP on the water dimer (cc-pVDZ, grid 2) gave an E_corr 1.1e-9 Eh from its
# converged value on 2 ranks.
KS_CONV_TOL_GRAD = 1e-5
MAX_CYCLE = 100
# Fock matrices in DIIS's space with our engine: 12 rather than PySCF's 8 took 4 fewer cycles
# over the 16 bundled molecules and (H2O)16, and never more on any of them; no initial guess,
# DIIS start or ADIIS/EDIIS variant did better (docs/performance.md). Open shells keep
# PySCF's 8: with 12 the CN radical (cc-pVDZ, def2-SVP) stalled 47 mEh above its minimum for
# 100 cycles, as PySCF's own UHF does with 12, and converges in 24 with 8.
KERNELS_DIIS_SPACE = 12
OPEN_SHELL_DIIS_SPACE = 8
# Square matrices (nao x nao) an SCF holds at once, per spin: overlap, core Hamiltonian, Fock,
# density, orbitals, the eigensolver's work space and the J/K buffers; DIIS keeps its vectors
# in a file once they are large. A lower bound, used to refuse hopeless budgets early.
SCF_SQUARE_MATRICES = {"rhf": 10, "uhf": 16}
BYTES_PER_MB = 10**6
# PySCF's own line between stable and unstable (pyscf.scf.stability): an orbital-Hessian
# eigenvalue below it means a lower SCF solution exists.
UNSTABLE_BELOW = -1e-5
# An SCF that ran out of cycles with its energy changing by less than this in each of its
# last STALL_CYCLES cycles stalled near a stationary point, and its orbital Hessian says
# whether that point is a saddle. A sextet Mn atom in def2-SVP stalls so on a saddle 0.14 Eh
# above the ground state (Hessian eigenvalue -0.127): its energy changes by 4e-9 Eh or less
# a cycle in cycles 11 to 25 and 1e-10 or less from cycle 44 on, while DIIS takes its gradient
# anywhere from 1e-7 to 1e-3 (PySCF's DIIS ends at 5.7e-6, its second-order solver at
# 3.5e-7): no minimiser converges there, and following the instability does.
STALLED_ENERGY_CHANGE = 1e-8
STALL_CYCLES = 5
# An overlap eigenvalue below this is linear dependence to machine precision (a duplicated
# function gives ~1e-16); PySCF's SCF drops the combinations below 1e-6 (PySCF 2.14's
# overlap_zero_eigenvalue_threshold), which no SCF of a singular overlap reaches.
SINGULAR_OVERLAP = 1e-13
# Davidson's eigenvalue convergence, its iterations, its start vectors among the rotations
# of the lowest diagonal Hessian elements, and the seed of one more that reaches every
# symmetry block. Unconverged, its lowest value is only an upper bound of the lowest
# eigenvalue: it proves an instability when below UNSTABLE_BELOW, and proves nothing above.
STABILITY_TOL = 1e-6
STABILITY_MAX_CYCLES = 100
STABILITY_START_VECTORS = 6
STABILITY_SEED = 7
# When DIIS ran out of cycles without stalling, the second-order solver (PySCF's
# co-iterative augmented Hessian, each iteration a few J/K builds) takes the orbitals into
# the basin of a minimum, to this orbital gradient and energy change, in at most this many
# iterations; DIIS then converges from there. DIIS wanders on the CN radical in 6-31G
# (PySCF's too: neither converges in 100 cycles), where the second-order solver reaches
# |g| 3e-7 in 6 iterations, 40 mEh below either, but then stops short of 1e-7.
SECOND_ORDER_GRADIENT = 1e-4
SECOND_ORDER_ENERGY = 1e-6
SECOND_ORDER_CYCLES = 50
# Rotations along an instability before an SCF that is still unstable is reported as such.
# One was enough for NO2's UHF at its experimental geometry in 6-31G and cc-pVDZ (the SCF
# from the rotated orbitals fell to PySCF's lower, stable solution in about 30 cycles).
FOLLOW_LIMIT = 3


@dataclass(frozen=True)
class ScfOptions:
    """How the SCF runs: who builds J and K (``kernels``: our engine, ``pyscf``: PySCF's
    density fitting), with which kernel sets, within which memory budget, with which
    scratch folder for a JK tensor that does not fit."""

    engine: str = "pyscf"
    kernels: ScfKernels | None = None
    budget: int | None = None
    scratch: ScratchArea | None = None
    keep_integrals: bool = False
    """Keep the JK-fit tensor after the SCF (the gradient's orbital response needs it)."""
    initial_density: np.ndarray | None = None
    """Start from this density instead of PySCF's guess (an optimisation's previous step)."""
    stability: bool = False
    """Check a closed-shell reference's internal stability too (open shells always are)."""
    follow_instability: bool = False
    """Rotate an unstable reference's orbitals along its instability and converge again
    (at most :data:`FOLLOW_LIMIT` times); implies ``stability``."""
    world: World = field(default_factory=World)
    """The ranks that all run this SCF (our engine's J/K builds are then collective)."""


@dataclass(frozen=True)
class ScfResult:
    """The converged (or restored) reference: what MP2 needs, the PySCF object, and (with our
    engine) what the J/K builds were."""

    section: ScfSection
    orbitals: StoredOrbitals
    mf: Any = None
    engine: ScfEngineSection | None = None

    @property
    def e_tot(self) -> float:
        return self.section.e_tot

    @property
    def converged(self) -> bool:
        return self.section.converged


def scf_minimum_bytes(nao: int, reference: str) -> int:
    return SCF_SQUARE_MATRICES[reference] * nao * nao * FP64_BYTES


def check_scf_memory(nao: int, reference: str, budget: int) -> None:
    need = scf_minimum_bytes(nao, reference)
    if budget < need:
        raise InputError(f"memory budget {format_size(budget)} is too small for the SCF of "
                         f"this molecule ({nao} basis functions): at least "
                         f"{format_size(need, rounded_up=True)} is needed; raise --memory or "
                         "use a smaller basis")


def jk_tensor_bytes(mol: gto.Mole, jk_auxbasis: str | dict) -> int:
    """Size of PySCF's JK-fit three-index tensor (naux x nao(nao+1)/2 doubles)."""
    nao = mol.nao_nr()
    return df.addons.make_auxmol(mol, jk_auxbasis).nao_nr() * nao * (nao + 1) // 2 * FP64_BYTES


def new_scf(calc: Calculation, options: ScfOptions = ScfOptions(),
            converging: bool = True) -> scf.hf.SCF:
    """The PySCF SCF object of ``calc``: UHF or RHF (never ROHF), or UKS or RKS with a double
    hybrid's exchange-correlation mix on its grid, density-fitted with its JK-fit basis
    unless the SCF is ``conventional``, at our thresholds, within the budget, with J/K from
    ``options.engine`` (its precision ladder only when ``converging``)."""
    mf = _reference_object(calc, options.world)
    _drop_chkfile(mf)
    if calc.scf_method == "df":
        mf = mf.density_fit(auxbasis=calc.jk_spec())
    mf.conv_tol = CONV_TOL
    # keep_integrals marks an SCF whose orbitals feed the response.
    tight = options.keep_integrals or calc.reference == "uhf"
    mf.conv_tol_grad = TIGHT_CONV_TOL_GRAD if tight else CONV_TOL_GRAD
    mf.max_cycle = MAX_CYCLE
    mf.verbose = 0
    if options.budget is not None:
        # PySCF's max_memory bounds the whole process; ours bounds what the calculation adds.
        mf.max_memory = lib.current_memory()[0] + options.budget / BYTES_PER_MB
    spins = 2 if calc.reference == "uhf" else 1
    if options.scratch is not None and spins * calc.mol.nao_nr() ** 2 >= DIIS_INCORE_SIZE:
        # Vectors this large PySCF's DIIS keeps in a file, by default an anonymous one in its
        # TMPDIR that a killed run leaves behind; named after the record, a resumed run's
        # ScratchArea.remove_leftovers finds it.
        mf.diis_file = _pin(mf, options, "diis")
    if calc.scf_method != "df":
        return mf
    if options.engine == "kernels":
        mf.diis_space = OPEN_SHELL_DIIS_SPACE if calc.reference == "uhf" else KERNELS_DIIS_SPACE
        use_kernel_engine(mf, calc.jk_auxbasis, options.kernels, options.budget,
                          options.scratch, converging, options.world)
        return mf
    mf.with_df.max_memory = mf.max_memory
    nbytes = jk_tensor_bytes(calc.mol, calc.jk_spec())
    if (options.budget is not None and options.scratch is not None
            and nbytes >= PYSCF_JK_IN_MEMORY_SHARE * options.budget):
        jk_file = _rank_file(options, "jk")
        check_space(jk_file.parent, nbytes, "the SCF's JK-fit tensor")
        mf.with_df._cderi_to_save = _pin(mf, options, "jk")
    return mf


def _pin(mf: scf.hf.SCF, options: ScfOptions, name: str) -> str:
    """The name by which PySCF is to open this rank's scratch file ``name``, created and held
    open (:meth:`dfmp2.df.store.ScratchArea.pin`) until :func:`_unpin`."""
    pinned = options.scratch.pin(_rank_file(options, name))
    mf.__dict__.setdefault(PINNED_FILES, {})[name] = pinned
    return pinned.name


def _unpin(mf: scf.hf.SCF, name: str) -> None:
    pinned = mf.__dict__.get(PINNED_FILES, {}).pop(name, None)
    if pinned is not None:
        pinned.remove()


def _rank_file(options: ScfOptions, name: str) -> Path:
    """The scratch file ``name`` of this rank's SCF: every rank runs its own PySCF SCF, whose
    files must not collide (rank 0 keeps the single-process name)."""
    if options.world.rank == 0:
        return options.scratch.named(name)
    return options.scratch.named(f"{name}.rank{options.world.rank}")


def _drop_chkfile(mf: scf.hf.SCF) -> None:
    """Delete the checkpoint file PySCF opened in its TMPDIR when ``mf`` was made, and turn
    checkpointing off: the run record is our checkpoint, and a killed run would leave the
    file behind."""
    handle = getattr(mf, "_chkfile", None)
    if handle is not None:
        handle.close()
        mf._chkfile = None
    mf.chkfile = None


def _reference_object(calc: Calculation, world: World) -> scf.hf.SCF:
    unrestricted = calc.reference == "uhf"
    if calc.functional is None:
        return scf.UHF(calc.mol) if unrestricted else scf.RHF(calc.mol)
    mf = (dft.UKS if unrestricted else dft.RKS)(calc.mol, xc=calc.functional.xc)
    if calc.grid is not None:
        mf.grids.level = calc.grid
    if world.size > 1:
        # Integrated whole on every rank, the exchange-correlation step was 91% of a double
        # hybrid's SCF on (H2O)8: each rank takes its share of the grid points instead.
        mf._numint = SharedGridNumInt(world)
    return mf


def grid_facts(mf: scf.hf.SCF) -> tuple[str, int, int]:
    """(exchange-correlation mix, grid level, grid points) of a Kohn-Sham SCF; ("", -1, 0)
    for Hartree-Fock."""
    grids = getattr(mf, "grids", None)
    if grids is None:
        return "", -1, 0
    points = 0 if grids.weights is None else int(grids.weights.size)
    return str(mf.xc), int(grids.level), points


def release_integrals(mf: scf.hf.SCF) -> None:
    """Drop the SCF's JK-fit three-index tensor (about 1 GB for (H2O)16), in memory or in its
    file: MP2 never uses it."""
    with_df = getattr(mf, "with_df", None)
    if with_df is not None:
        with_df.reset()
    _unpin(mf, "jk")


@contextlib.contextmanager
def integrals_released_on_failure(mf: scf.hf.SCF) -> Iterator[None]:
    """Within: anything that stops the job (a signal, a failed write) drops ``mf``'s JK-fit
    tensor and its file on the way out; on success they stay for the next stage."""
    try:
        yield
    except BaseException:
        release_integrals(mf)
        raise


def settling_threshold(calc: Calculation) -> float:
    """Below what orbital gradient an SCF that stalls short of the one it aims at settles:
    the standard 1e-7, or for Kohn-Sham above the grid's floor."""
    return KS_CONV_TOL_GRAD if calc.functional is not None else CONV_TOL_GRAD


class TightConvergence:
    """PySCF's convergence test (or, with our engine, its precision ladder's) at the orbital
    gradient aimed at, which settles for less once the gradient has stayed below
    ``settle_at`` for :data:`SETTLE_CYCLES` cycles of exact builds without halving, each
    changing the energy by less than :data:`SETTLE_ENERGY_CHANGE`: an SCF still converging,
    however slowly, goes on, and one still wandering does not settle."""

    def __init__(self, mf: scf.hf.SCF, ladder: PrecisionLadder | None,
                 settle_at: float = CONV_TOL_GRAD) -> None:
        self.ladder, self.conv_tol = ladder, mf.conv_tol
        self.settle_at = settle_at
        self.held: list[float] = []
        """The orbital gradients of the exact cycles in a row below ``settle_at``."""
        self.settled = False
        """Whether the SCF ended short of the gradient aimed at."""

    def restart(self) -> None:
        """Forget the cycles of an earlier convergence of the same SCF object."""
        self.held, self.settled = [], False

    def __call__(self, envs: dict) -> bool:
        if self._tight(envs):
            return True
        exact = self.ladder is None or self.ladder.exact
        gradient = float(envs["norm_gorb"])
        change = abs(float(envs["e_tot"]) - float(envs["last_hf_e"]))
        held = exact and gradient < self.settle_at and change < SETTLE_ENERGY_CHANGE
        self.held = self.held + [gradient] if held else []
        window = self.held[-SETTLE_CYCLES:]
        self.settled = len(window) == SETTLE_CYCLES and min(window) > 0.5 * window[0]
        return self.settled

    def _tight(self, envs: dict) -> bool:
        if self.ladder is not None:
            return self.ladder.check_convergence(envs)
        energy_ok = abs(envs["e_tot"] - envs["last_hf_e"]) < envs["conv_tol"]
        gradient_ok = envs["norm_gorb"] < envs["conv_tol_grad"]
        # PySCF's check after its loop relaxes both thresholds and takes either.
        if envs["conv_tol"] > self.conv_tol:
            return energy_ok or gradient_ok
        return energy_ok and gradient_ok


def run_scf(calc: Calculation, options: ScfOptions = ScfOptions()) -> ScfResult:
    """Converge the reference (and, with ``follow_instability``, follow its instabilities);
    running out of memory or disk inside PySCF is a RunFailure."""
    mf = new_scf(calc, options)
    # Whatever stops it, a signal during the stability check included, its JK-fit tensor's
    # file goes too (it was left behind): a resumed run rebuilds the tensor.
    with integrals_released_on_failure(mf):
        return _converged_reference(mf, calc, options)


def _converged_reference(mf: scf.hf.SCF, calc: Calculation, options: ScfOptions) -> ScfResult:
    tight = None
    settle_at = settling_threshold(calc)
    if mf.conv_tol_grad < settle_at:
        with_df = getattr(mf, "with_df", None)
        tight = TightConvergence(mf, with_df.ladder if isinstance(with_df, KernelDF) else None,
                                 settle_at)
        mf.check_convergence = tight
    cycles, gradient = 0, float("nan")
    earlier_cycles = 0
    changes: list[float] = []

    def count_cycle(envs: dict) -> None:
        nonlocal cycles, gradient
        cycles = earlier_cycles + int(envs.get("cycle", 0)) + 1
        gradient = float(envs.get("norm_gorb", gradient))
        if "e_tot" in envs and "last_hf_e" in envs:
            changes.append(abs(float(envs["e_tot"]) - float(envs["last_hf_e"])))

    def stalled() -> bool:
        last = changes[-STALL_CYCLES:]
        return len(last) == STALL_CYCLES and max(last) < STALLED_ENERGY_CHANGE

    mf.callback = count_cycle
    def blas():
        return torch_owns_the_cores() if options.engine == "kernels" else contextlib.nullcontext()

    def converge(density: np.ndarray | None) -> float:
        changes.clear()
        if tight is not None:
            tight.restart()
        try:
            with blas(), warnings.catch_warnings():
                # PySCF's guess warns of a singular overlap before it fails on it; the
                # failure is explained in one line below.
                warnings.filterwarnings("ignore", message=".*not strictly positive definite")
                return mf.kernel(dm0=density)
        except OSError as exc:
            raise RunFailure(f"the SCF could not write its JK-fit tensor file: "
                             f"{exc.strerror or exc}") from None
        except BaseException as exc:
            if out_of_memory(exc):
                raise RunFailure(f"the SCF ran out of memory ({calc.mol.nao_nr()} basis "
                                 "functions); raise --memory if the machine has more, or use "
                                 "a smaller basis") from None
            if isinstance(exc, np.linalg.LinAlgError):
                _refuse_singular_overlap(calc.mol)
            raise
        finally:
            _unpin(mf, "diis")

    e_tot = converge(options.initial_density)
    with_df = getattr(mf, "with_df", None)
    if isinstance(with_df, KernelDF):
        with_df.end_scf()
    # Only an SCF from the guess: one started from another geometry's density (a displaced
    # point of a frequency job, an optimisation's step) must stay on that density's state,
    # where the second-order solver could take it to another minimum.
    if (not mf.converged and not stalled() and calc.functional is None
            and options.initial_density is None):
        with blas():
            basin = second_order_basin(mf)
        if basin is not None:
            coefficients, occupations, iterations = basin
            earlier_cycles = cycles + iterations
            e_tot = converge(mf.make_rdm1(coefficients, occupations))
    with blas():
        stability, eigenvalue, mode = stability_of(mf, calc, options, stalled())
    followed = 0
    while stability == "unstable" and options.follow_instability and followed < FOLLOW_LIMIT:
        log.info("following the instability (orbital-Hessian eigenvalue %.4g) from E = "
                 "%.10f Eh", eigenvalue, e_tot)
        earlier_cycles = cycles
        lower = converge(mf.make_rdm1(rotated_orbitals(mf, mode), mf.mo_occ))
        followed += 1
        came_back = not lower < e_tot
        e_tot = lower
        with blas():
            stability, eigenvalue, mode = stability_of(mf, calc, options, stalled())
        if came_back:
            # The same start would come back again: another rotation is wasted work.
            log.info("the SCF from the rotated orbitals came back to E = %.10f Eh", lower)
            break
    warn_of_stability(calc, stability, eigenvalue, followed)
    with blas():
        unpairing, stability = checked_unpairing(mf, calc, stability)
    orbitals = StoredOrbitals(np.asarray(mf.mo_energy), np.asarray(mf.mo_occ),
                              np.asarray(mf.mo_coeff))
    s2 = spin_square(calc.mol, orbitals)
    _warn_if_contaminated(calc, s2)
    removed = removed_combinations(calc.mol, orbitals.mo_coeff)
    if removed:
        _warn_once_per_job("dependent", "the basis is nearly linearly dependent: %d of its %d "
                           "functions' combinations (overlap eigenvalues below %.0e) %s left "
                           "out of the orbitals, as PySCF leaves them out; the energies are "
                           "those of the space that remains", removed, calc.mol.nao_nr(),
                           scf.hf.overlap_zero_eigenvalue_threshold,
                           "was" if removed == 1 else "were")
    log.info("SCF %s %s: E = %.10f after %d cycles (converged=%s)", calc.reference_name,
             calc.scf_method, e_tot, cycles, mf.converged)
    if tight is not None and tight.settled:
        log.info("the SCF settled at an orbital gradient of %.1e, where it stalled short of "
                 "the %.0e asked of these orbitals", gradient, mf.conv_tol_grad)
    engine = scf_engine_section(with_df) if isinstance(with_df, KernelDF) else None
    section = ScfSection(float(e_tot), bool(mf.converged), cycles, calc.scf_method,
                         calc.reference_name, calc.jk_name(), engine_name(calc, options),
                         *grid_facts(mf), stability=stability, stability_eigenvalue=eigenvalue,
                         unpairing_eigenvalue=unpairing,
                         orbital_gradient=gradient,
                         settled=bool(tight is not None and tight.settled),
                         instabilities_followed=followed, s2=s2,
                         removed_combinations=removed)
    if not options.keep_integrals:
        release_integrals(mf)
    return ScfResult(section, orbitals, mf, engine)


def second_order_basin(mf: scf.hf.SCF) -> tuple[np.ndarray, np.ndarray, int] | None:
    """After DIIS ran out of cycles while its energy still moved (a wandering SCF; one that
    stalled is left to the stability check): PySCF's second-order solver from ``mf``'s last
    orbitals into the basin of a minimum (:data:`SECOND_ORDER_GRADIENT`). Its orbitals and
    iterations, from which DIIS converges to the SCF's own thresholds; None when it does not
    get there."""
    log.warning("the SCF did not converge in %d cycles of DIIS; going on with the "
                "second-order solver", mf.max_cycle)
    solver = mf.newton()
    # PySCF's own test at the basin's thresholds: the precision ladder's reads DIIS's cycle.
    solver.check_convergence = None
    solver.conv_tol, solver.conv_tol_grad = SECOND_ORDER_ENERGY, SECOND_ORDER_GRADIENT
    solver.max_cycle = SECOND_ORDER_CYCLES
    solver.verbose = 0
    done = {"iterations": 0}
    solver.callback = lambda envs: done.update(iterations=int(envs.get("imacro", 0)) + 1)
    solver.kernel(mf.mo_coeff, mf.mo_occ)
    if not solver.converged:
        return None
    log.info("the second-order solver reached an orbital gradient below %.0e in %d "
             "iterations; DIIS goes on from there", SECOND_ORDER_GRADIENT, done["iterations"])
    return solver.mo_coeff, solver.mo_occ, done["iterations"]


def lowest_hessian_mode(mf: scf.hf.SCF) -> tuple[float, np.ndarray, bool]:
    """The lowest eigenvalue of the converged ``mf``'s orbital Hessian for real internal
    rotations, in PySCF's normalisation (pyscf.scf.stability's rhf_internal, uhf_internal),
    its unit eigenvector (the rotation, in PySCF's packing of the occupied-virtual pairs,
    alpha's before beta's) and whether Davidson converged on them: PySCF's Hessian
    operator, by Davidson."""
    unrestricted = np.asarray(mf.mo_coeff).ndim == 3
    generate = newton_ah.gen_g_hop_uhf if unrestricted else newton_ah.gen_g_hop_rhf
    _, hop, hdiag = generate(mf, mf.mo_coeff, mf.mo_occ, with_symmetry=False)
    return _lowest_eigenpair(lambda x: 2.0 * hop(x).real, 2.0 * hdiag)


def lowest_unpairing_eigenvalue(mf: scf.hf.SCF) -> tuple[float, bool]:
    """The lowest eigenvalue of a converged closed-shell restricted ``mf``'s orbital Hessian
    for the rotations that turn its alpha and beta orbitals apart (the triplet ones), in
    PySCF's normalisation (pyscf.scf.stability's rhf_external, RHF -> UHF): below
    :data:`UNSTABLE_BELOW` a lower unrestricted solution exists, which no internal rotation
    reaches (H2 at 3 A is internally stable, 0.17 Eh above its UHF). The operator is the
    Fock matrix's occupied-virtual difference plus the density's triplet response. With it,
    whether Davidson converged on it."""
    coeff, occ = np.asarray(mf.mo_coeff), np.asarray(mf.mo_occ)
    occupied, virtual = occ > 0, occ == 0
    orbo, orbv = coeff[:, occupied], coeff[:, virtual]
    fock = coeff.T @ (mf.get_hcore() + mf.get_veff(mf.mol, mf.make_rdm1(coeff, occ))) @ coeff
    foo, fvv = fock[np.ix_(occupied, occupied)], fock[np.ix_(virtual, virtual)]
    response = mf.gen_response(singlet=False, hermi=1)

    def hop(x: np.ndarray) -> np.ndarray:
        x = x.reshape(orbv.shape[1], orbo.shape[1])
        half = orbv @ (2.0 * x) @ orbo.T
        return (fvv @ x - x @ foo + orbv.T @ response(half + half.T) @ orbo).ravel()

    eigenvalue, _, converged = _lowest_eigenpair(
        hop, (np.diag(fvv)[:, None] - np.diag(foo)[None, :]).ravel())
    return eigenvalue, converged


def _lowest_eigenpair(hop, hdiag: np.ndarray) -> tuple[float, np.ndarray, bool]:
    """The lowest eigenvalue of the symmetric operator ``hop`` (diagonal ``hdiag``), its
    unit eigenvector and whether Davidson converged on them."""
    def precondition(dx: np.ndarray, e: float, _x0: np.ndarray) -> np.ndarray:
        shifted = hdiag - e
        shifted[np.abs(shifted) < 1e-8] = 1e-8
        return dx / shifted

    # The rotations of the smallest diagonal elements, plus two vectors that reach every
    # symmetry block: PySCF's own start (1 / diagonal) and a fixed random one. From unit
    # vectors alone, the search stays in the blocks they lie in: CH with B2PLYP was called
    # stable (-7e-6, its soft pi rotation) where a rotation of -2.2e-2 leads 0.35 mEh lower.
    starts = []
    for index in np.argsort(hdiag)[:STABILITY_START_VECTORS]:
        start = np.zeros_like(hdiag)
        start[index] = 1.0
        starts.append(start)
    starts.append(1.0 / np.where(np.abs(hdiag) < 1e-8, 1e-8, hdiag))
    starts.append(np.random.default_rng(STABILITY_SEED).standard_normal(hdiag.shape))
    converged, eigenvalues, vectors = lib.davidson1(
        lambda xs: [hop(x) for x in xs], starts, precondition, tol=STABILITY_TOL,
        max_cycle=STABILITY_MAX_CYCLES, nroots=1, verbose=0)
    vector = np.asarray(vectors[0], dtype=float)
    return float(eigenvalues[0]), vector / np.linalg.norm(vector), bool(converged[0])


def rotated_orbitals(mf: scf.hf.SCF, mode: np.ndarray) -> np.ndarray:
    """``mf``'s orbitals turned by the unitary exp(kappa) of the rotation ``mode`` (a
    :func:`lowest_hessian_mode` vector): each channel's antisymmetric occupied-virtual
    generator, as PySCF's stability analysis steps along an instability."""
    coeff, occ = np.asarray(mf.mo_coeff), np.asarray(mf.mo_occ)
    channels = (coeff, occ) if coeff.ndim == 3 else (coeff[None], occ[None])
    turned, offset = [], 0
    for c, o in zip(*channels):
        size = int(np.count_nonzero(o == 0)) * int(np.count_nonzero(o > 0))
        generator = scf.hf.unpack_uniq_var(mode[offset:offset + size], o)
        turned.append(c @ scipy.linalg.expm(generator))
        offset += size
    return np.stack(turned) if coeff.ndim == 3 else turned[0]


def engine_name(calc: Calculation, options: ScfOptions) -> str:
    """Who built J and K: our kernels, PySCF's density fitting, or PySCF's exact integrals."""
    if calc.scf_method != "df":
        return "pyscf-conventional"
    return options.engine


# Stored orbitals further than this from orthonormal (max |C^T S C - 1|) were not made in
# this basis: an SCF leaves them within 1e-13, and the record keeps them exactly.
ORTHONORMAL_TOLERANCE = 1e-8


def orbital_problem(mol: gto.Mole, orbitals: StoredOrbitals) -> str | None:
    """Why an interrupted run's orbitals cannot serve ``mol`` (None: they can): another
    shape, another electron count, or not orthonormal in its basis (a record written with
    another basis definition, or altered since)."""
    coeff, occ = np.asarray(orbitals.mo_coeff), np.asarray(orbitals.mo_occ)
    channels = coeff if coeff.ndim == 3 else coeff[None]
    nao = mol.nao_nr()
    energies = np.asarray(orbitals.mo_energy)
    if (channels.ndim != 3 or channels.shape[1] != nao
            or not occ.size == energies.size == channels.shape[0] * channels.shape[2]):
        return (f"have the shape {coeff.shape} ({occ.size} occupations, {energies.size} "
                f"energies), not that of {nao} basis functions")
    if not all(np.issubdtype(a.dtype, np.number) for a in (channels, energies, occ)):
        return "hold values that are not numbers"
    if not (np.all(np.isfinite(channels)) and np.all(np.isfinite(energies))):
        return "hold non-finite numbers"
    if not abs(float(occ.sum()) - mol.nelectron) < 1e-8:
        return f"hold {float(occ.sum()):g} electrons, not {mol.nelectron}"
    overlap = mol.intor_symmetric("int1e_ovlp")
    worst = max(float(np.abs(c.T @ overlap @ c - np.eye(c.shape[1])).max()) for c in channels)
    if not worst < ORTHONORMAL_TOLERANCE:
        return f"are not orthonormal in this basis (off by {worst:.1e})"
    return None


def stability_of(mf: scf.hf.SCF, calc: Calculation, options: ScfOptions,
                 stalled: bool = False) -> tuple[str, float, np.ndarray | None]:
    """(``stable``/``unstable``/``undecided``/``not checked``, the lowest orbital-Hessian
    eigenvalue, its rotation) of ``mf``, converged or ``stalled`` near a stationary point:
    checked for open shells, and for closed shells when asked (``stability`` or
    ``follow_instability``). ``undecided``: Davidson did not converge, and its estimate,
    an upper bound, lies above the line."""
    asked = calc.reference == "uhf" or options.stability or options.follow_instability
    if not ((mf.converged or stalled) and asked):
        return "not checked", float("nan"), None
    eigenvalue, mode, converged = lowest_hessian_mode(mf)
    return _verdict(eigenvalue, converged), eigenvalue, mode


def _verdict(eigenvalue: float, converged: bool) -> str:
    if eigenvalue < UNSTABLE_BELOW:
        return "unstable"
    return "stable" if converged else "undecided"


def checked_stability(mf: scf.hf.SCF, calc: Calculation,
                      options: ScfOptions) -> tuple[str, float]:
    """:func:`stability_of` without the rotation, warning of an unstable reference or an
    undecided check."""
    stability, eigenvalue, _ = stability_of(mf, calc, options)
    warn_of_stability(calc, stability, eigenvalue)
    return stability, eigenvalue


def warn_of_stability(calc: Calculation, stability: str, eigenvalue: float,
                      followed: int = 0) -> None:
    """The warning an unstable reference, or an undecided check of its internal stability,
    gets."""
    if stability == "unstable":
        _warn_unstable(calc, eigenvalue, followed)
    elif stability == "undecided":
        _warn_undecided(calc, "internal", eigenvalue)


def checked_unpairing(mf: scf.hf.SCF, calc: Calculation, stability: str) -> tuple[float, str]:
    """:func:`lowest_unpairing_eigenvalue` of a closed-shell restricted reference whose
    stability was checked (NaN for any other), warning when a lower unrestricted solution
    exists (an internal check alone called stretched H2 stable); and the reference's
    stability, ``undecided`` when it was ``stable`` and this check did not converge above
    the line."""
    if stability == "not checked" or np.asarray(mf.mo_coeff).ndim == 3:
        return float("nan"), stability
    eigenvalue, converged = lowest_unpairing_eigenvalue(mf)
    if eigenvalue < UNSTABLE_BELOW:
        _warn_once_per_job("unpairing", "the %s reference is unstable toward an unrestricted "
                           "one (lowest orbital-Hessian eigenvalue %.4g for rotations that "
                           "turn alpha and beta apart): a lower unrestricted solution exists, "
                           "and MP2 on this one is questionable; --reference uhf "
                           "--follow-instability converges to it", calc.reference_name.upper(),
                           eigenvalue)
    elif not converged and stability == "stable":
        _warn_undecided(calc, "unrestricted", eigenvalue)
        stability = "undecided"
    return eigenvalue, stability


@contextlib.contextmanager
def reference_warned_once() -> Iterator[None]:
    """Within: each warning about the reference (unstable, spin-contaminated, a nearly
    dependent basis, its gradient) is given once, and logged at INFO after that. A frequency
    job's SCFs are the same reference 0.005 Bohr apart (NO2's unstable UHF gave the same
    warning 20 times over its points), and an optimisation's steps nearly so."""
    token = _reference_warned.set(set())
    try:
        yield
    finally:
        _reference_warned.reset(token)


def _warn_unstable(calc: Calculation, eigenvalue: float, followed: int = 0) -> None:
    name = calc.reference_name.upper()
    remedy = (f" (still so after following {followed} instabilities)" if followed else
              "; --follow-instability converges to it")
    _warn_once_per_job("unstable", "the %s reference is internally unstable (lowest "
                       "orbital-Hessian eigenvalue %.4g): a lower %s solution exists, and MP2 "
                       "on this one is questionable%s", name, eigenvalue, name, remedy)


def _refuse_singular_overlap(mol: gto.Mole) -> None:
    """After a linear-algebra failure in the SCF: an InputError when the basis functions
    are linearly dependent to machine precision, which no SCF can run (a shell given twice,
    as in 6-31G*(d): PySCF's initial guess failed on its singular overlap, a traceback).
    Nearly dependent bases are not this: the SCF drops their few combinations."""
    overlap = mol.intor_symmetric("int1e_ovlp")
    smallest = float(np.linalg.eigvalsh(overlap)[0])
    if smallest < SINGULAR_OVERLAP:
        raise InputError(f"the functions of basis {mol.basis!r} are linearly dependent on "
                         f"this molecule (the overlap's smallest eigenvalue is "
                         f"{smallest:.1e}: a shell given twice?); choose another basis")


def removed_combinations(mol: gto.Mole, mo_coeff: np.ndarray) -> int:
    """How many combinations of ``mol``'s basis functions the orbitals leave out (PySCF's
    SCF drops the overlap's eigenvectors of a nearly linearly dependent basis)."""
    return mol.nao_nr() - np.asarray(mo_coeff).shape[-1]


def warn_of_moving_basis(mol: gto.Mole, mo_coeff: np.ndarray) -> None:
    """A nuclear gradient on orbitals that leave combinations out: the analytic gradient
    (PySCF's and ours) takes the space left out as fixed, while it turns with the atoms."""
    removed = removed_combinations(mol, mo_coeff)
    if removed:
        _warn_once_per_job("moving basis", "the analytic gradient leaves out how the %d %s "
                           "of basis functions removed for near linear dependence %s with the "
                           "atoms, so it is not exactly the energy's derivative (9e-8 Eh/Bohr "
                           "off for acetylene in aug-cc-pV5Z, 9e-6 for an H4 chain 0.45 A apart "
                           "in aug-cc-pVTZ); a basis with fewer diffuse functions avoids it",
                           removed, "combination" if removed == 1 else "combinations",
                           "moves" if removed == 1 else "move")


def _warn_undecided(calc: Calculation, toward: str, eigenvalue: float) -> None:
    _warn_once_per_job("undecided", "the check of the %s reference's stability toward %s "
                       "solutions did not converge in %d Davidson iterations (lowest "
                       "orbital-Hessian eigenvalue %.4g so far, an upper bound): whether a "
                       "lower solution exists is not known", calc.reference_name.upper(),
                       "other " + calc.reference_name.upper() if toward == "internal"
                       else "unrestricted", STABILITY_MAX_CYCLES, eigenvalue)


def _warn_if_contaminated(calc: Calculation, s2: float) -> None:
    spin = calc.mol.spin
    if spin_contaminated(s2, spin):
        _warn_once_per_job("contaminated", "the %s reference is spin-contaminated: <S^2> = "
                           "%.4f against S(S+1) = %.4f, so higher spin states are mixed into "
                           "it and MP2 on it is questionable", calc.reference_name.upper(),
                           s2, exact_spin_square(spin))


def _warn_once_per_job(kind: str, message: str, *args) -> None:
    """A warning about the reference; inside :func:`reference_warned_once`, once of each
    ``kind`` for the job (later ones at INFO)."""
    warned = _reference_warned.get()
    level = logging.INFO if warned is not None and kind in warned else logging.WARNING
    scope = "" if warned is None else " (said once for all of this job's geometries)"
    log.log(level, message + "%s", *args, scope)
    if warned is not None:
        warned.add(kind)


def restored_scf(calc: Calculation, section: ScfSection, orbitals: StoredOrbitals,
                 options: ScfOptions = ScfOptions()) -> ScfResult:
    """The SCF of an interrupted run, as a PySCF object carrying its orbitals (whose J/K, if
    ever asked for, come from ``options.engine``; our engine then builds in fp64). Its
    stability is checked now when asked and the interrupted run did not (``--stability``
    given only to the resuming run was dropped without a word), and its <S^2> computed when
    its record is older than it."""
    mf = new_scf(calc, options, converging=False)
    mf.mo_coeff = orbitals.mo_coeff
    mf.mo_energy = orbitals.mo_energy
    mf.mo_occ = orbitals.mo_occ
    mf.e_tot = section.e_tot
    mf.converged = section.converged
    if section.stability == "not checked":
        with (torch_owns_the_cores() if options.engine == "kernels"
              else contextlib.nullcontext()), integrals_released_on_failure(mf):
            stability, eigenvalue = checked_stability(mf, calc, options)
            unpairing, stability = checked_unpairing(mf, calc, stability)
        section = dataclasses.replace(section, stability=stability,
                                      stability_eigenvalue=eigenvalue,
                                      unpairing_eigenvalue=unpairing)
    if np.isnan(section.s2):
        section = dataclasses.replace(section, s2=spin_square(calc.mol, orbitals))
    _warn_if_contaminated(calc, section.s2)
    return ScfResult(section, orbitals, mf)
