"""Our J/K engine inside PySCF's SCF.

PySCF keeps driving the SCF (guess, DIIS, diagonalisation, level shift, convergence tests):
:class:`KernelDF` takes the place of PySCF's density-fitting object, so every J/K request of
RHF, UHF or Kohn-Sham, with or without exact exchange, is answered by
:class:`dfmp2.scf.jk.JkEngine` from our own JK-fit tensor.

Precision. fp64 kernels (torch on the CPU or a GPU) build every J/K in fp64. fp32 kernels
(``--precision fp32``, and NKI, which has no fp64) run a mixed scheme,
:class:`PrecisionSchedule`: J/K in fp32 while the SCF is far from convergence, then, once
the energy change or the orbital gradient reaches the fp32 noise floor, fp64 builds on the
host until PySCF's own tests pass on two consecutive fp64 builds. Convergence is never
declared on an fp32 Fock matrix, and the thresholds are PySCF's (1e-12 Eh, 1e-7).

Several ranks. Every rank runs the same SCF, and every J/K build is collective: rank 0's
density goes to every rank, each builds J and K over its own slice of the fit functions, and
the parts are summed (O(nao^2) numbers per build, never the tensor). Every rank thus gets the
same J/K bits, and so takes the same SCF steps and precision-schedule decisions.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np
from pyscf import df

import kernels
from kernels.accounting import KernelAccounting

from dfmp2.df.auxbasis import AuxBasis, make_auxmol
from dfmp2.df.store import ScratchArea
from dfmp2.errors import InputError, RunFailure
from dfmp2.scf.jk import JkEngine, factorize
from dfmp2.scf.jk_tensor import build_jk_tensor, build_shared_jk_tensor, jk_tensor_bytes
from dfmp2.records.sections import ScfEngineSection
from dfmp2.system.distributed import World
from dfmp2.system.memory import FP64_BYTES, JK_TENSOR_IN_MEMORY_SHARE, fits_in_memory

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
                require_nki: bool = False) -> ScfKernels:
    """The SCF's kernel sets for a backend and precision; the fp64 partner of an fp32 set runs
    torch on the same device (the host CPU next to a NeuronCore)."""
    ledger = KernelAccounting()
    fast = kernels.load(backend, precision, accounting=ledger, nki_mode=nki_mode,
                        require_nki=require_nki)
    if fast.precision == "fp64":
        return ScfKernels(fast, fast)
    return ScfKernels(fast, kernels.load("torch", "fp64", device=str(fast.device),
                                         accounting=ledger))


class PrecisionSchedule:
    """When to leave fp32 builds and when convergence may be declared."""

    def __init__(self, engine: JkEngine, kernels: ScfKernels, conv_tol: float) -> None:
        self.engine, self.kernels, self.conv_tol = engine, kernels, conv_tol
        self.engine.kernel_set = kernels.fast
        self.exact_builds_at_switch: int | None = None if kernels.mixed else 0

    @property
    def exact(self) -> bool:
        return self.exact_builds_at_switch is not None

    def check_convergence(self, envs: dict) -> bool:
        """PySCF's test (``and`` in the SCF loop, ``or`` in its final check with relaxed
        thresholds), passed only on exact builds."""
        delta = abs(envs["e_tot"] - envs["last_hf_e"])
        gradient = envs["norm_gorb"]
        if not self.exact:
            if delta < FP32_PHASE_ENERGY or gradient < FP32_PHASE_GRADIENT:
                log.info("fp32 J/K reached its noise floor (dE %.1e, |g| %.1e): fp64 builds "
                         "from now on", delta, gradient)
                self.engine.kernel_set = self.kernels.exact
                self.exact_builds_at_switch = len(self.engine.builds)
            return False
        if len(self.engine.builds) - self.exact_builds_at_switch < EXACT_BUILDS_TO_CONVERGE:
            return False
        final_check = envs["conv_tol"] > self.conv_tol
        energy_ok, gradient_ok = delta < envs["conv_tol"], gradient < envs["conv_tol_grad"]
        return (energy_ok or gradient_ok) if final_check else (energy_ok and gradient_ok)


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
        self.schedule: PrecisionSchedule | None = None
        self.timings: dict[str, float] = {}

    def build(self) -> "KernelDF":
        if self.engine is not None:
            return self
        self.auxmol = make_auxmol(self.mol, self.aux)
        nao, naux = self.mol.nao_nr(), self.auxmol.nao_nr()
        work = max(FP64_BYTES * nao * nao * 8, (1 - JK_TENSOR_IN_MEMORY_SHARE) * self.budget / 2)
        if self.world.size > 1:
            if self.scratch is None:
                raise ValueError("a JK-fit tensor spread over ranks needs a scratch area")
            tensor = build_shared_jk_tensor(self.mol, self.auxmol, self.kernels.exact,
                                            int(work), self.scratch, self.world, self.budget,
                                            self.timings)
        else:
            out_of_core = not fits_in_memory(jk_tensor_bytes(nao, naux), self.budget,
                                             JK_TENSOR_IN_MEMORY_SHARE)
            tensor = build_jk_tensor(self.mol, self.auxmol, self.kernels.exact, int(work),
                                     self.scratch if out_of_core else None, self.timings)
        self.engine = JkEngine(tensor, self.kernels.fast, self.kernels.exact, int(work))
        return self

    def attach(self, mf) -> None:
        """Drive ``mf``'s convergence test by the precision schedule."""
        self.build()
        self.schedule = PrecisionSchedule(self.engine, self.kernels, mf.conv_tol)
        mf.check_convergence = self.schedule.check_convergence

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
        layout = tensor.layout
        diagonal = layout.diagonal_rows()
        blksize = blksize or self.blockdim
        for p0 in range(0, tensor.naux, blksize):
            p1 = min(tensor.naux, p0 + blksize)
            rows = tensor.store.read_columns(p0, p1).numpy().copy()
            rows[diagonal] *= 2.0
            yield np.ascontiguousarray(layout.gather_packed(rows).T)

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
        engine_df.kernels.mixed)


def use_kernel_engine(mf, aux: AuxBasis, kernels: ScfKernels, budget: int,
                      scratch: ScratchArea | None, converging: bool = True,
                      world: World | None = None) -> KernelDF:
    """Put our engine in ``mf`` (a density-fitted PySCF SCF object) in place of PySCF's. For an
    SCF about to converge, the precision schedule drives its convergence test; for a
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
