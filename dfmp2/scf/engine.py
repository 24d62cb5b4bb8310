"""Our J/K engine inside PySCF's SCF.

PySCF keeps driving the SCF (guess, DIIS, diagonalisation, level shift, convergence tests):
:class:`KernelDF` takes the place of PySCF's density-fitting object, so every J/K request of
RHF, UHF or Kohn-Sham, with or without exact exchange, is answered by
:class:`dfmp2.scf.jk.JkEngine` from our own JK-fit tensor.

Precision, :class:`PrecisionLadder`, one mechanism for every kernel set: K in fp32 (fp64
partial sums) while the SCF is far from convergence, then, once the orbital gradient or the
energy change reaches the fp32 noise floor or the energy rises, fp64 builds until PySCF's own
tests pass on fp64 builds. The fp32 builds run on torch fp32 beside fp64 kernels (the
default), or on the fp32 kernel set itself (``--precision fp32``, and NKI, which has no fp64)
with the fp64 builds on the host. Convergence is never declared on an fp32 Fock matrix, and
the thresholds are PySCF's (1e-12 Eh, 1e-7).

Several ranks. Every rank runs the same SCF, and every J/K build is collective: rank 0's
density goes to every rank, each builds J and K over its own slice of the fit functions, and
the parts are summed (O(nao^2) numbers per build, never the tensor). Every rank thus gets the
same J/K bits, and so takes the same SCF steps and precision-ladder decisions.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np
from pyscf import df
from pyscf.dft.rks import KohnShamDFT

import kernels
from kernels.accounting import KernelAccounting

from dfmp2.df.auxbasis import AuxBasis, make_auxmol
from dfmp2.df.store import ScratchArea
from dfmp2.errors import InputError, RunFailure
from dfmp2.scf.jk import JkEngine, factorize
from dfmp2.scf.jk_tensor_build import build_jk_tensor
from dfmp2.records.sections import ScfEngineSection
from dfmp2.system.distributed import World
from dfmp2.system.memory import FP64_BYTES, JK_TENSOR_IN_MEMORY_SHARE

log = logging.getLogger(__name__)

ENGINES = ("kernels", "pyscf")
# The fp32 phase ends once an SCF step changes the energy by less than this, or the orbital
# gradient falls below the second number: about where fp32 J/K noise (1e-7 relative) stops
# the SCF from improving (see docs/kernels.md for the measurements).
FP32_PHASE_ENERGY = 1e-6
FP32_PHASE_GRADIENT = 1e-4
# Exact (fp64) builds that must agree before convergence can be declared.
EXACT_BUILDS_TO_CONVERGE = 2


@dataclass
class ScfKernels:
    """The kernel sets of the SCF: ``fast`` for most builds, ``exact`` (fp64) for the last
    ones and for the tensor's fit. They are the same object when ``fast`` is fp64. Both
    count their calls in one ledger, separate from the MP2 stage's."""

    fast: object
    exact: object

    @property
    def mixed(self) -> bool:
        return self.fast is not self.exact

    @property
    def accounting(self):
        return self.fast.accounting


def scf_kernels(backend: str, precision: str | None, nki_mode: str | None = None,
                require_nki: bool = False, ladder: bool = True) -> ScfKernels:
    """The SCF's kernel sets for a backend and precision. ``exact`` is fp64: the requested set,
    or torch on the same device as an fp32 one (the host CPU next to a NeuronCore). ``fast``
    is the requested set, or, for fp64 with the ``ladder``, torch fp32 on the same device."""
    ledger = KernelAccounting()
    requested = kernels.load(backend, precision, accounting=ledger, nki_mode=nki_mode,
                             require_nki=require_nki)
    device = str(requested.device)
    if requested.precision != "fp64":
        return ScfKernels(requested, kernels.load("torch", "fp64", device=device,
                                                  accounting=ledger))
    if not ladder:
        return ScfKernels(requested, requested)
    return ScfKernels(kernels.load("torch", "fp32", device=device, accounting=ledger),
                      requested)


class PrecisionLadder:
    """Which precision each J/K build runs in, and when convergence may be declared: the one
    precision mechanism of every kernel set (docs/kernels.md).

    With a mixed pair of kernel sets, K runs in fp32 (partial sums over fixed blocks of fit
    functions added in fp64; J in fp64) while the SCF is far from convergence; the first
    step that reaches the fp32 noise (orbital gradient or energy change) or raises the
    energy sends every later build to fp64. PySCF's tests may pass only on fp64 builds,
    EXACT_BUILDS_TO_CONVERGE of them at least, so the converged energy is that of an
    all-fp64 SCF. DIIS keeps its fp32-built vectors: restarting it at the switch cost 16 to
    18 more cycles over the 16 bundled molecules and 3 on (H2O)16 (docs/kernels.md).

    With ``exact_energy_change`` (Hartree-Fock), the energy change that PySCF's test
    compares with 1e-12 Eh is computed from the density change (:func:`energy_change`), not
    as the difference of two energies of hundreds of Eh whose rounding alone is a few
    1e-12 Eh: the same test at the same thresholds, but decided by the SCF rather than by
    rounding luck, which kept (H2O)8 cycling five more times with its orbital gradient
    already below 1e-7 and made the cycle count follow the summation order."""

    def __init__(self, engine: JkEngine, kernels: ScfKernels, conv_tol: float,
                 exact_energy_change: bool = True) -> None:
        self.engine, self.kernels, self.conv_tol = engine, kernels, conv_tol
        self.engine.kernel_set = kernels.fast
        self.exact_builds_at_switch: int | None = None if kernels.mixed else 0
        self.exact_energy_change = exact_energy_change
        self.last_vhf: np.ndarray | None = None

    @property
    def exact(self) -> bool:
        return self.exact_builds_at_switch is not None

    def check_convergence(self, envs: dict) -> bool:
        """PySCF's test (``and`` in the SCF loop, ``or`` in its final check with relaxed
        thresholds), passed only on exact builds."""
        change = envs["e_tot"] - envs["last_hf_e"]
        gradient = envs["norm_gorb"]
        last_vhf, self.last_vhf = self.last_vhf, envs["vhf"]
        if not self.exact:
            reason = _reason_to_leave_fp32(envs["cycle"], change, gradient)
            if reason is not None:
                self.finish(reason)
            return False
        if len(self.engine.builds) - self.exact_builds_at_switch < EXACT_BUILDS_TO_CONVERGE:
            return False
        if self.exact_energy_change and last_vhf is not None:
            change = energy_change(envs["h1e"], envs["dm"], envs["dm_last"], envs["vhf"],
                                   last_vhf)
        final_check = envs["conv_tol"] > self.conv_tol
        energy_ok = abs(change) < envs["conv_tol"]
        gradient_ok = gradient < envs["conv_tol_grad"]
        return (energy_ok or gradient_ok) if final_check else (energy_ok and gradient_ok)

    def finish(self, reason: str = "the SCF ended") -> None:
        """Every build from now on in fp64."""
        if self.exact:
            return
        log.info("fp32 J/K builds end (%s): fp64 builds from now on", reason)
        self.engine.kernel_set = self.kernels.exact
        self.exact_builds_at_switch = len(self.engine.builds)


def _reason_to_leave_fp32(cycle: int, change: float, gradient: float) -> str | None:
    """Why the step just taken on an fp32 build ends the fp32 builds, or None. The first
    step is measured from the guess's energy, which is no SCF energy, so its rise is no
    sign of fp32 trouble."""
    if gradient < FP32_PHASE_GRADIENT or abs(change) < FP32_PHASE_ENERGY:
        return f"dE {change:.1e} Eh, |g| {gradient:.1e}: the fp32 noise floor"
    if change > 0 and cycle > 0:
        return f"the energy rose by {change:.1e} Eh"
    return None


def energy_change(h1e: np.ndarray, dm: np.ndarray, dm_last: np.ndarray, vhf: np.ndarray,
                  vhf_last: np.ndarray) -> float:
    """E(dm) - E(dm_last) of Hartree-Fock, tr(h dD) + tr((V + V_last) dD) / 2 summed over
    spins: exact for a potential V linear and symmetric in D (density-fitted J and K are),
    and computed from the small dD instead of two large energies."""
    step = np.asarray(dm) - np.asarray(dm_last)
    potential = np.asarray(vhf) + np.asarray(vhf_last)
    return float(np.sum(np.asarray(h1e) * step) + 0.5 * np.sum(potential * step))


class KernelDF(df.DF):
    """PySCF's density-fitting object whose J and K come from our engine."""

    def __init__(self, mol, aux: AuxBasis, kernels: ScfKernels, budget: int,
                 scratch: ScratchArea | None, world: World | None = None) -> None:
        super().__init__(mol, aux.spec)
        self.aux = aux
        self.kernels = kernels
        self.budget = budget
        self.scratch = scratch
        self.world = world or World()
        self.engine: JkEngine | None = None
        self.ladder: PrecisionLadder | None = None
        self.timings: dict[str, float] = {}

    def build(self) -> "KernelDF":
        if self.engine is not None:
            return self
        self.auxmol = make_auxmol(self.mol, self.aux)
        nao = self.mol.nao_nr()
        work = max(FP64_BYTES * nao * nao * 8, (1 - JK_TENSOR_IN_MEMORY_SHARE) * self.budget / 2)
        if self.world.size > 1 and self.scratch is None:
            raise ValueError("a JK-fit tensor spread over ranks needs a scratch area")
        tensor = build_jk_tensor(self.mol, self.auxmol, self.kernels.exact, self.budget,
                                 self.scratch, self.world, self.timings)
        # After the SCF (a tensor rebuilt for the gradient's response once the SCF's was
        # released) every build is fp64.
        finished = self.ladder is not None and self.ladder.exact
        self.engine = JkEngine(tensor, self.kernels.exact if finished else self.kernels.fast,
                               self.kernels.exact, int(work))
        return self

    def attach(self, mf) -> None:
        """Drive ``mf``'s convergence test by the precision ladder (with the exact energy
        change for Hartree-Fock; a Kohn-Sham energy is not quadratic in D)."""
        self.build()
        self.ladder = PrecisionLadder(self.engine, self.kernels, mf.conv_tol,
                                      not isinstance(mf, KohnShamDFT))
        mf.check_convergence = self.ladder.check_convergence

    def end_scf(self) -> None:
        """Every later build (the stability check's, the gradient's response) in fp64, also
        after an SCF that stopped unconverged on fp32 builds."""
        if self.ladder is not None:
            self.ladder.finish()

    @property
    def out_of_core(self) -> bool:
        return self.engine is not None and self.engine.tensor.store.location != "memory"

    def get_naoaux(self) -> int:
        return self.build().engine.tensor.naux

    def get_jk(self, dm, hermi=1, with_j=True, with_k=True, direct_scf_tol=None, omega=None):
        if omega is not None and omega != 0:
            raise InputError("range-separated exchange is not supported by the kernels SCF "
                             "engine; use --scf-engine pyscf")
        self.build()
        dms = np.asarray(dm, dtype=np.float64)
        shape = dms.shape
        dms = dms.reshape(-1, shape[-1], shape[-1])
        tags = _orbital_tags(dm, dms.shape[0]) if with_k else None
        if self.world.size > 1:
            # Rank 0's density (and orbitals) on every rank: the ranks' parts of J and K are
            # then parts of one J and K, whatever bits each rank's own SCF produced.
            dms, tags = self.world.broadcast((dms, tags), "sharing the density for J/K")
        factors = None
        if with_k:
            factors = [factorize(dms[n], hermi, *tags[n]) for n in range(dms.shape[0])]
        vj, vk = self.engine.build(dms, factors, with_j, with_k)
        if self.world.size > 1:
            vj, vk = self._summed(vj, vk)
        return (None if vj is None else vj.reshape(shape),
                None if vk is None else vk.reshape(shape))

    def _summed(self, vj: np.ndarray | None, vk: np.ndarray | None):
        """Every rank's parts of J and K added up, in one message."""
        parts = [part for part in (vj, vk) if part is not None]
        total = self.world.allreduce_sum(np.concatenate([part.ravel() for part in parts]),
                                         "adding up J/K")
        pieces = iter(np.split(total, len(parts)))
        return tuple(None if part is None else next(pieces).reshape(part.shape)
                     for part in (vj, vk))

    def loop(self, blksize=None):
        """PySCF's view of the tensor: fp64 blocks of (naux, nao(nao+1)/2), for PySCF code
        that reads the DF tensor itself."""
        tensor = self.build().engine.tensor
        if tensor.width != tensor.naux:
            raise RunFailure("PySCF code that reads the whole JK-fit tensor cannot run with the "
                             "tensor spread over ranks; run it in one process")
        diagonal = tensor.layout.diagonal_rows()
        blksize = blksize or self.blockdim
        for p0 in range(0, tensor.naux, blksize):
            p1 = min(tensor.naux, p0 + blksize)
            rows = tensor.store.read_columns(p0, p1).numpy().copy()
            rows[diagonal] *= 2.0
            yield np.ascontiguousarray(rows.T)

    def reset(self, mol=None):
        if self.engine is not None:
            self.engine.tensor.close()
            self.engine = None
        return super().reset(mol)


def _orbital_tags(dm, nset: int) -> list[tuple]:
    """(mo_coeff, mo_occ) for each density PySCF tagged with its orbitals, else (None, None)."""
    coeff, occ = getattr(dm, "mo_coeff", None), getattr(dm, "mo_occ", None)
    if coeff is None or occ is None:
        return [(None, None)] * nset
    coeff, occ = np.asarray(coeff), np.asarray(occ)
    if occ.ndim == 1 and nset == 1:
        return [(coeff, occ)]
    if occ.ndim == 2 and occ.shape[0] == nset:
        return [(coeff[n], occ[n]) for n in range(nset)]
    return [(None, None)] * nset


def scf_engine_section(engine_df: KernelDF) -> ScfEngineSection:
    builds = engine_df.engine.builds
    return ScfEngineSection(
        "kernels", len(builds), [round(b.seconds, 6) for b in builds],
        [b.precision for b in builds], [b.executor for b in builds],
        [b.factor_columns for b in builds], engine_df.engine.tensor.naux,
        engine_df.engine.tensor.nbytes, engine_df.out_of_core, sum(engine_df.timings.values()),
        engine_df.kernels.mixed, engine_df.engine.tensor.screened_pairs)


def use_kernel_engine(mf, aux: AuxBasis, kernels: ScfKernels, budget: int,
                      scratch: ScratchArea | None, converging: bool = True,
                      world: World | None = None) -> KernelDF:
    """Put our engine in ``mf`` (a density-fitted PySCF SCF object) in place of PySCF's. For an
    SCF about to converge, the precision ladder drives its convergence test; for a
    converged one (restored from a record) every later build is fp64 and the tensor is built
    at the first request. With a ``world`` of several ranks, every J/K build (and the tensor's)
    is collective: every rank must make the same requests."""
    if not converging:
        kernels = ScfKernels(kernels.exact, kernels.exact)
    engine_df = KernelDF(mf.mol, aux, kernels, budget, scratch, world)
    mf.with_df = engine_df
    if converging:
        engine_df.attach(mf)
    return engine_df
