"""The fully relaxed analytic gradient of the DF-MP2 total energy (E_SCF + E_corr, or its
SCS/SOS form) on a converged density-fitted RHF or UHF reference.

The energy differentiated is exactly the one reported: DF-SCF with the SCF's JK-fit basis,
RI-MP2 with the RI basis fitted with the full Coulomb metric, frozen core, scaled opposite-
and same-spin parts. The stages, each handed what it needs:

1. B = L^-1 (Q|ia) per channel (:func:`dfmp2.df_tensors.build_fitted_tensors`).
2. The amplitude sweep over occupied blocks of B (:mod:`dfmp2.gradient_amplitudes`): Gamma,
   P_ij, P_ab and the energies, every O(N^5) product through the kernel set's gemm.
3. Gamma fitted, G = L^-T Gamma, and V = sum_c n_c L^-T B_c Gamma_c^T L^-1; one sweep over the
   RI basis gives the orbital derivative X and the RI derivative-integral terms
   (:func:`dfmp2.gradient_integrals.ri_pass`).
4. The orbital response (:mod:`dfmp2.gradient_response`): frozen-core density, Lagrangian,
   Z-vector with the SCF's J/K, relaxed and energy-weighted densities.
5. The JK-fit derivative terms of the SCF and the relaxed density
   (:func:`dfmp2.gradient_integrals.jk_pass`), then the one-electron, overlap and nuclear
   terms.

Sign convention: ``gradient`` is dE/dR (Eh/Bohr), one row per atom, the negative force.
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field

import numpy as np
import torch
from pyscf import df

import kernels
from dfmp2.auxbasis import AuxBasis, describe, make_auxmol, ri_basis
from dfmp2.df_tensors import build_fitted_tensors
from dfmp2.energy import SCS_OS_DEFAULT, SCS_SS_DEFAULT, SOS_OS_DEFAULT, BlockReader
from dfmp2.errors import InputError, RunFailure
from dfmp2.gradient_amplitudes import (AmplitudeIntermediates, Scales,
                                       amplitude_intermediates, gradient_occ_block)
from dfmp2.gradient_integrals import (JkChannel, RiChannel, aux_block_functions, jk_pass,
                                      one_electron_gradient, ri_pass, two_index_gradient)
from dfmp2.gradient_response import (Channel, ScfPotential, channels_of, orbital_derivative,
                                     relax)
from dfmp2.metric import JK_LINDEP_THRESHOLD, FitMetric
from dfmp2.mp2 import FitBasis, fit_basis

log = logging.getLogger(__name__)

METHOD_SCALES = {"mp2": (1.0, 1.0), "scs-mp2": (SCS_OS_DEFAULT, SCS_SS_DEFAULT),
                 "sos-mp2": (SOS_OS_DEFAULT, 0.0)}
# Work memory of the integral sweeps: one auxiliary block's raw and derivative integrals.
DEFAULT_BLOCK_BYTES = 256 * 2**20


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


def _as_aux(aux: AuxBasis | str | dict) -> AuxBasis:
    return aux if isinstance(aux, AuxBasis) else AuxBasis(aux, describe(aux), str(aux))


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


def fitted_form(metric: FitMetric, gamma: torch.Tensor) -> torch.Tensor:
    """F Gamma with F = L^-T (Cholesky) or U e^-1/2 (eigen): the fitted coefficients of
    (Q|ia) are c = F B, so F turns any B-form intermediate into its J^-1-fitted form."""
    factor = metric.factor.to(gamma.dtype)
    if metric.kind == "cholesky":
        return torch.linalg.solve_triangular(factor.T, gamma, upper=True)
    return factor @ gamma


@dataclass
class RiStage:
    """What the RI basis hands on: the amplitude sweep's densities and energies, G (fitted
    Gamma) per channel and V = sum_c n_c c_c G_c^T (naux x naux)."""

    amplitudes: AmplitudeIntermediates
    gamma_fit: list[torch.Tensor]
    v_ri: np.ndarray


def _ri_stage(mol, ri: FitBasis, channels: list[Channel], kernel_set, scales: Scales,
              occ_block: int | None, block_bytes: int, timings: dict[str, float]) -> RiStage:
    clock = time.perf_counter
    t0 = clock()
    orbitals = [(c.mo_coeff[:, c.active], c.mo_coeff[:, c.virtual]) for c in channels]
    stores = build_fitted_tensors(mol, ri.auxmol, orbitals, ri.metric, kernel_set, block_bytes,
                                  None)
    timings["ri_tensor"] = clock() - t0
    try:
        t0 = clock()
        readers = [BlockReader(store, len(c.virtual), kernel_set.dtype, kernel_set.device)
                   for store, c in zip(stores, channels)]
        e_occ = [torch.as_tensor(c.mo_energy[c.active], device=kernel_set.device)
                 for c in channels]
        e_vir = [torch.as_tensor(c.mo_energy[c.virtual], device=kernel_set.device)
                 for c in channels]
        itemsize = torch.tensor([], dtype=kernel_set.dtype).element_size()
        block = occ_block or gradient_occ_block(max(len(c.active) for c in channels),
                                                max(len(c.virtual) for c in channels),
                                                itemsize)
        amplitudes = amplitude_intermediates(readers, e_occ, e_vir, kernel_set, block, scales)
        timings["amplitudes"] = clock() - t0
        t0 = clock()
        gamma = [g.cpu() for g in amplitudes.gamma]
        # sum_ia B_ia^P Gamma_ia^Q in B form; F (.) F^T makes it V.
        coupling = sum(c.occupancy * store.data @ g.T
                       for c, store, g in zip(channels, stores, gamma))
    finally:
        for store in stores:
            store.close()
    v_ri = fitted_form(ri.metric, fitted_form(ri.metric, coupling).T).numpy()
    gamma_fit = [fitted_form(ri.metric, g) for g in gamma]
    timings["ri_fit"] = clock() - t0
    return RiStage(amplitudes, gamma_fit, 0.5 * (v_ri + v_ri.T))


def kernel(mf, nfrozen: int = 0, ri_aux: AuxBasis | str | dict | None = None,
           jk_aux: AuxBasis | str | dict | None = None, kernel_set=None,
           scs: tuple[float, float] = (1.0, 1.0), occ_block: int | None = None,
           block_bytes: int = DEFAULT_BLOCK_BYTES) -> GradientResult:
    """Energy and relaxed gradient of E_SCF + c_os E_OS + c_ss E_SS on the converged
    density-fitted SCF ``mf`` (RHF or UHF; its ``with_df`` is PySCF's DF or dfmp2's KernelDF),
    with the lowest ``nfrozen`` occupied orbitals of each spin frozen.

    ``ri_aux`` is the MP2 fitting basis (default: the RI partner of the orbital basis);
    ``jk_aux`` the SCF's JK-fit basis, which must be the one ``mf`` was converged with (the
    default). ``kernel_set`` runs the O(N^5) sweep (default: torch fp64); ``occ_block``
    overrides the occupied block of that sweep; ``block_bytes`` bounds the work memory of one
    auxiliary block of the integral sweeps. B, Gamma and the JK pass's fitted integrals are
    held in memory.
    """
    clock = time.perf_counter
    timings: dict[str, float] = {}
    mol = mf.mol
    if mol.natm < 2:
        raise InputError("a gradient needs at least two atoms")
    if not getattr(mf, "converged", False):
        raise RunFailure("the SCF is not converged: its gradient would be meaningless")
    jk = scf_jk_basis(mf)
    if jk_aux is not None and _as_aux(jk_aux).spec != jk.spec:
        raise InputError(f"the JK-fit basis {_as_aux(jk_aux).name} is not the one the SCF "
                         f"was converged with ({jk.name})")
    channels = channels_of(mf, nfrozen)
    for channel in channels:
        if nfrozen < 0 or len(channel.active) == 0 or len(channel.virtual) == 0:
            raise InputError(f"cannot freeze {nfrozen} orbitals: every spin channel needs "
                             "active occupied and virtual orbitals")
    kernel_set = kernel_set if kernel_set is not None else kernels.load("torch", "fp64")
    scales = Scales(*scs)
    ri = fit_basis(mol, ri_basis(mol, None) if ri_aux is None else _as_aux(ri_aux))
    if ri.metric.kind != "cholesky":
        log.warning("the RI metric is not positive definite: the gradient of the "
                    "eigen-truncated fit is approximate")

    stage = _ri_stage(mol, ri, channels, kernel_set, scales, occ_block, block_bytes, timings)
    t0 = clock()
    functions = aux_block_functions(mol.nao_nr(), block_bytes)
    ri_channels = [RiChannel(torch.from_numpy(np.ascontiguousarray(c.mo_coeff[:, c.active])),
                             torch.from_numpy(np.ascontiguousarray(c.mo_coeff[:, c.virtual])),
                             g, c.occupancy) for c, g in zip(channels, stage.gamma_fit)]
    halves, grad_ri = ri_pass(mol, ri.auxmol, ri_channels, functions)
    grad_ri += two_index_gradient(ri.auxmol, stage.v_ri, mol.natm)
    timings["ri_derivatives"] = clock() - t0

    t0 = clock()
    potential = ScfPotential(mf, closed_shell=len(channels) == 1)
    relaxed = relax(channels, potential,
                    [orbital_derivative(c, xo, xv) for c, (xo, xv) in zip(channels, halves)],
                    [p.cpu().numpy() for p in stage.amplitudes.p_occ],
                    [p.cpu().numpy() for p in stage.amplitudes.p_vir])
    timings["response"] = clock() - t0

    t0 = clock()
    jk_channels = [JkChannel(c.mo_coeff[:, c.occupied], p, c.occupancy)
                   for c, p in zip(channels, relaxed.p_relaxed)]
    grad_jk = jk_pass(mol, make_auxmol(mol, jk), jk_channels, functions, JK_LINDEP_THRESHOLD)
    timings["jk_derivatives"] = clock() - t0

    t0 = clock()
    scf_density = sum(c.occupancy * c.mo_coeff[:, c.occupied] @ c.mo_coeff[:, c.occupied].T
                      for c in channels)
    grad_1e = one_electron_gradient(mol, scf_density + sum(relaxed.p_relaxed),
                                    relaxed.w_total)
    timings["one_electron"] = clock() - t0

    energies = stage.amplitudes
    e_corr = scales.os * energies.e_os + scales.ss * energies.e_ss
    e_scf = float(mf.e_tot)
    return GradientResult(e_scf + e_corr, e_scf, e_corr, energies.e_os, energies.e_ss,
                          (scales.os, scales.ss), grad_1e + grad_jk + grad_ri, timings,
                          potential.builds)
