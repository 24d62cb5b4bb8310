"""The fully relaxed analytic gradient of the DF-MP2 total energy (E_SCF + E_corr, or its
SCS/SOS form) on a converged density-fitted RHF or UHF reference.

The energy differentiated is exactly the one reported: DF-SCF with the SCF's JK-fit basis,
RI-MP2 with the RI basis fitted with the full Coulomb metric, frozen core, scaled opposite-
and same-spin parts. The stages, each handed what it needs:

1. B = L^-1 (Q|ia) per channel (:func:`dfmp2.df.fitted.build_fitted_tensors`).
2. The amplitude sweep over occupied blocks of B (:mod:`dfmp2.grad.amplitudes`): Gamma,
   P_ij, P_ab and the energies, every O(N^5) product through the kernel set's gemm.
3. Gamma fitted, G = L^-T Gamma, and V = sum_c n_c L^-T B_c Gamma_c^T L^-1; one sweep over the
   RI basis gives the orbital derivative X and the RI derivative-integral terms
   (:func:`dfmp2.grad.integrals.ri_pass`).
4. The orbital response (:mod:`dfmp2.grad.response`): frozen-core density, Lagrangian,
   Z-vector with the SCF's J/K, relaxed and energy-weighted densities.
   Stages 1-4 live in :mod:`dfmp2.grad.density`, which the properties' MP2 density
   (:func:`dfmp2.grad.density.mp2_densities`) runs too, without the RI derivative integrals.
5. The JK-fit derivative terms of the SCF and the relaxed density
   (:func:`dfmp2.grad.integrals.jk_pass`), then the one-electron, overlap and nuclear
   terms.

B, Gamma and the JK pass's half-transformed integrals live in memory or, when they would take
more than half the memory budget, in scratch files
(:func:`dfmp2.grad.storage.plan_storage`).

With a world of several ranks (torchrun, srun) every rank runs every stage on its share:
the ranks build B together into shared scratch files; the amplitude sweep's column blocks are
dealt out by cost (:func:`dfmp2.grad.amplitudes.deal_column_blocks`); the integral passes
take auxiliary shell blocks and the one-electron terms atoms; the O(N^2) results (densities,
V, the halves of X, the gradient) are summed over the ranks with allreduce, which gives every
rank the same bits, so the orbital response runs identically on every rank with the SCF's
collective J/K. Gamma and the JK pass's integrals are never summed: each rank keeps its share
in its own scratch file and reads the others' (:mod:`dfmp2.grad.sharing`).

Sign convention: ``gradient`` is dE/dR (Eh/Bohr), one row per atom, the negative force.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np
from pyscf import df

import kernels
from dfmp2.df.auxbasis import AuxBasis, describe, make_auxmol
from dfmp2.df.metric import JK_LINDEP_THRESHOLD
from dfmp2.df.store import ScratchArea
from dfmp2.errors import InputError
from dfmp2.grad.amplitudes import Scales
from dfmp2.grad.density import as_aux, density_stages, reference_channels, ri_fit, scf_density
from dfmp2.grad.kohn_sham import exact_exchange_share, is_kohn_sham, xc_gradient
from dfmp2.grad.integrals import JkChannel, aux_block_functions, jk_pass, one_electron_gradient
from dfmp2.grad.response import ResponseSolve
from dfmp2.grad.storage import check_budget, held_bytes, plan_storage
from dfmp2.mp2.kernel import fit_basis
from dfmp2.scf.reference import warn_of_moving_basis
from dfmp2.system.blas_threads import torch_owns_the_cores
from dfmp2.system.distributed import World

# Re-exported: the job preamble checks a gradient's budget before the SCF, and callers size
# the gradient's tensors, through this module.
__all__ = ["GradientResult", "check_budget", "fit_basis", "held_bytes", "kernel",
           "plan_storage", "scf_jk_basis"]


@dataclass
class GradientResult:
    """The energy of the chosen method and its nuclear gradient (natm, 3) in Eh/Bohr."""

    e_tot: float
    e_scf: float
    e_corr: float
    e_os: float
    e_ss: float
    scales: tuple[float, float]
    gradient: np.ndarray
    timings: dict[str, float] = field(default_factory=dict)
    jk_builds: int = 0
    """J/K builds of the orbital response (Lagrangian, Z-vector iterations, relaxed density)."""
    out_of_core: bool = False
    response: ResponseSolve | None = None
    """How the orbital response's Z-vector equations were solved, and their residual."""
    ranks: dict[int, tuple[list, float]] = field(default_factory=dict)
    """Per rank: its column blocks of the amplitude sweep [channel, k0, k1], seconds busy."""
    e_disp: float = 0.0
    """A double hybrid's dispersion energy, included in ``e_tot`` (its gradient in
    ``gradient``); added by the job, which knows the functional."""
    relaxed_densities: list[np.ndarray] = field(default_factory=list)
    """Per channel the AO density of the differentiated energy: the SCF's plus the relaxed
    MP2 correction (spin-summed for a closed shell; alpha, beta for UHF)."""


def scf_jk_basis(mf) -> AuxBasis:
    """The JK-fit basis ``mf`` was converged with (KernelDF's, or PySCF DF's: its
    ``auxbasis``, PySCF's default when unset)."""
    with_df = getattr(mf, "with_df", None)
    if with_df is None:
        raise InputError("the gradient needs a density-fitted SCF: the energy it "
                         "differentiates is DF-SCF plus DF-MP2")
    aux = getattr(with_df, "aux", None)
    if isinstance(aux, AuxBasis):
        return aux
    spec = with_df.auxbasis or df.make_auxbasis(mf.mol)
    return AuxBasis(spec, describe(spec), "default")


def _checked_reference(mf, nfrozen: int, jk_aux: AuxBasis | str | dict | None):
    """The JK-fit basis and the spin channels of ``mf``, once it is a reference whose
    gradient means something."""
    channels = reference_channels(mf, nfrozen)
    jk = scf_jk_basis(mf)
    if jk_aux is not None and as_aux(jk_aux).spec != jk.spec:
        raise InputError(f"the JK-fit basis {as_aux(jk_aux).name} is not the one the SCF "
                         f"was converged with ({jk.name})")
    return jk, channels


@torch_owns_the_cores()
def kernel(mf, nfrozen: int = 0, ri_aux: AuxBasis | str | dict | None = None,
           jk_aux: AuxBasis | str | dict | None = None, kernel_set=None,
           scs: tuple[float, float] = (1.0, 1.0), occ_block: int | None = None,
           budget: int | None = None, scratch: ScratchArea | None = None,
           world: World | None = None) -> GradientResult:
    """Energy and relaxed gradient of E_SCF + c_os E_OS + c_ss E_SS on the converged
    density-fitted SCF ``mf`` (RHF or UHF, or a double hybrid's RKS or UKS with its MP2 scales
    as ``scs``: :mod:`dfmp2.grad.kohn_sham`; its ``with_df`` is PySCF's DF or dfmp2's KernelDF),
    with the lowest ``nfrozen`` occupied orbitals of each spin frozen.

    ``ri_aux`` is the MP2 fitting basis (default: the RI partner of the orbital basis);
    ``jk_aux`` the SCF's JK-fit basis, which must be the one ``mf`` was converged with (the
    default). ``kernel_set`` runs the O(N^5) sweep (default: torch fp64); ``occ_block``
    overrides the occupied block of that sweep. B, Gamma and the JK pass's fitted integrals
    are held in memory unless they would take more than half of ``budget`` (bytes); then they
    go to scratch files in ``scratch`` (see :func:`plan_storage`).

    With a ``world`` of several ranks, every rank calls this with the same ``mf`` (its J/K
    collective) and takes its share of every stage; all ranks return the same result.
    """
    world = world or World()
    clock = time.perf_counter
    mol = mf.mol
    jk, channels = _checked_reference(mf, nfrozen, jk_aux)
    warn_of_moving_basis(mol, mf.mo_coeff)
    exchange = exact_exchange_share(mf)
    kernel_set = kernel_set if kernel_set is not None else kernels.load("torch", "fp64")
    scales = Scales(*scs)
    ri = ri_fit(mol, ri_aux)

    jk_auxmol = make_auxmol(mol, jk)
    storage = plan_storage(channels, ri.metric.naux_fit, jk_auxmol.nao_nr(), mol.nao_nr(),
                           budget, None if scratch is None else scratch.area("gradient"), world)
    stages = density_stages(mf, channels, ri, kernel_set, scales, occ_block, storage, world,
                            derivatives=True)
    timings, relaxed = stages.timings, stages.relaxed

    t0 = clock()
    functions = aux_block_functions(mol.nao_nr(), storage.block_bytes)
    jk_channels = [JkChannel(c.mo_coeff[:, c.occupied], p, c.occupancy, exchange)
                   for c, p in zip(channels, relaxed.p_relaxed)]
    grad_jk = jk_pass(mol, jk_auxmol, jk_channels, functions, JK_LINDEP_THRESHOLD, storage.open,
                      storage.block_bytes, world)
    timings["jk_derivatives"] = clock() - t0

    t0 = clock()
    densities = [scf_density(c) + p for c, p in zip(channels, relaxed.p_relaxed)]
    grad_1e = one_electron_gradient(mol, sum(densities), relaxed.w_total, world)
    timings["one_electron"] = clock() - t0
    if is_kohn_sham(mf):
        t0 = clock()
        grad_1e += xc_gradient(mf, [scf_density(c) for c in channels], relaxed.p_relaxed,
                               world)
        timings["exchange_correlation"] = clock() - t0

    energies = stages.amplitudes
    e_corr = scales.os * energies.e_os + scales.ss * energies.e_ss
    e_scf = float(mf.e_tot)
    return GradientResult(e_scf + e_corr, e_scf, e_corr, energies.e_os, energies.e_ss,
                          (scales.os, scales.ss), grad_1e + grad_jk + stages.grad_ri, timings,
                          stages.jk_builds, storage.out_of_core, relaxed.response,
                          energies.ranks, relaxed_densities=densities)
