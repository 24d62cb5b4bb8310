"""Stages 1-4 of the DF-MP2 gradient, which are also the MP2 one-particle density of the
properties (:func:`mp2_densities`): B per channel, the amplitude sweep (Gamma, P_ij, P_ab and
the energies), Gamma fitted and the RI pass (the orbital derivative X, and the RI
derivative-integral gradient only when a gradient is wanted), then the orbital response with
the SCF's own J/K (:mod:`dfmp2.grad.response`). :func:`dfmp2.grad.kernel.kernel` goes on from
here with the derivative terms.

The relaxed density is the derivative of the method's energy with respect to a one-electron
perturbation: the SCF's density plus P_ij, P_ab, the frozen-active block and the Z-vector's
P_ai. The unrelaxed one is the SCF's plus P_ij and P_ab alone, as PySCF's
``dfmp2_native.make_rdm1(relaxed=False)`` forms it (no frozen-core block).
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field

import numpy as np
import torch

import kernels
from dfmp2.df.auxbasis import AuxBasis, describe, ri_basis
from dfmp2.df.fitted import build_fitted_tensors
from dfmp2.df.metric import FitMetric
from dfmp2.df.store import ScratchArea
from dfmp2.errors import InputError, RunFailure
from dfmp2.grad.amplitudes import (AmplitudeIntermediates, Scales, amplitude_intermediates,
                                   deal_column_blocks, gradient_occ_block)
from dfmp2.grad.integrals import (RiChannel, aux_block_functions, ri_pass,
                                  two_index_gradient)
from dfmp2.grad.response import (RelaxedDensities, ResponseSolve, ScfPotential,
                                 orbital_derivative, relax)
from dfmp2.grad.sharing import ColumnSplit
from dfmp2.grad.storage import GradientStorage, plan_storage
from dfmp2.mp2.channels import Channel, split_channels
from dfmp2.mp2.kernel import FitBasis, fit_basis
from dfmp2.mp2.pairs import BlockReader
from dfmp2.system.blas_threads import torch_owns_the_cores
from dfmp2.system.distributed import World
from dfmp2.system.memory import FP64_BYTES

log = logging.getLogger(__name__)

# Column blocks of the amplitude sweep per rank at least, so that dealing them by cost can
# even out the ranks' loads.
COLUMN_BLOCKS_PER_RANK = 2


def as_aux(aux: AuxBasis | str | dict) -> AuxBasis:
    """``aux`` as an AuxBasis (a PySCF basis name or dict is named after itself)."""
    return aux if isinstance(aux, AuxBasis) else AuxBasis(aux, describe(aux), str(aux))


def fitted_form(metric: FitMetric, gamma: torch.Tensor) -> torch.Tensor:
    """F Gamma with F = L^-T (Cholesky) or U e^-1/2 (eigen): the fitted coefficients of
    (Q|ia) are c = F B, so F turns any B-form intermediate into its J^-1-fitted form."""
    factor = metric.factor.to(gamma.dtype)
    if metric.kind == "cholesky":
        return torch.linalg.solve_triangular(factor.T, gamma, upper=True)
    return factor @ gamma


@dataclass
class RiStage:
    """What the RI basis hands on: the amplitude sweep's densities and energies, the stores of
    G (fitted Gamma) per channel and V = sum_c n_c c_c G_c^T (naux x naux)."""

    amplitudes: AmplitudeIntermediates
    gamma_fit: list
    v_ri: np.ndarray


def _column_blocks(naux: int, ncols: int, max_bytes: int) -> list[tuple[int, int]]:
    width = max(1, max_bytes // (3 * FP64_BYTES * naux))
    return [(c0, min(ncols, c0 + width)) for c0 in range(0, ncols, width)]


def _own_columns(naux: int, gamma: ColumnSplit, max_bytes: int) -> list[tuple[int, int]]:
    """This rank's columns of ``gamma`` in blocks of about ``max_bytes``."""
    return [(lo + c0, lo + c1) for lo, hi in gamma.spans()
            for c0, c1 in _column_blocks(naux, hi - lo, max_bytes)]


def _coupling(b_store, gamma: ColumnSplit, max_bytes: int) -> torch.Tensor:
    """sum_ia B_ia^P Gamma_ia^Q over this rank's columns, column block by column block."""
    naux = b_store.shape[0]
    total = torch.zeros((naux, gamma.shape[0]), dtype=torch.float64)
    for c0, c1 in _own_columns(naux, gamma, max_bytes):
        total += b_store.read_columns(c0, c1) @ gamma.read_columns(c0, c1).T
    return total


def _fit(metric: FitMetric, gamma: ColumnSplit, storage: GradientStorage, name: str,
         opened: list, world: World) -> ColumnSplit:
    """G = F Gamma over this rank's columns: in Gamma's own store (fitted in place, column
    block by column block) when the fit keeps the row count, else in a new one (added to
    ``opened``) with a row per auxiliary function; published for the RI pass's row reads."""
    naux_fit, ncols = gamma.shape
    if metric.naux == naux_fit:
        fitted = gamma
    else:
        fitted = ColumnSplit(name, metric.naux, ncols, gamma.ranges, world, storage.open)
        opened.append(fitted)
    for c0, c1 in _own_columns(max(metric.naux, naux_fit), gamma, storage.block_bytes):
        fitted.write_columns(c0, c1, fitted_form(metric, gamma.read_columns(c0, c1)))
    if fitted is not gamma:
        gamma.close()
    fitted.publish("the fitted amplitude intermediate G")
    return fitted


def _fitted_tensors(mol, ri: FitBasis, channels: list[Channel], kernel_set,
                    storage: GradientStorage, world: World) -> list:
    """B of every channel; with several ranks built by all of them into shared scratch files
    that every rank reads."""
    orbitals = [(c.mo_coeff[:, c.active], c.mo_coeff[:, c.virtual]) for c in channels]
    return build_fitted_tensors(mol, ri.auxmol, orbitals, ri.metric, kernel_set,
                                storage.block_bytes, storage.scratch, world=world)


def _occ_block(channels: list[Channel], kernel_set, occ_block: int | None,
               storage: GradientStorage, world: World) -> int:
    """The column block of the amplitude sweep: ``occ_block``, else the largest whose slab
    fits, made small enough for a few blocks per rank."""
    if occ_block is not None:
        return occ_block
    nocc = max(len(c.active) for c in channels)
    itemsize = torch.tensor([], dtype=kernel_set.dtype).element_size()
    block = gradient_occ_block(nocc, max(len(c.virtual) for c in channels), itemsize,
                               storage.slab_bytes)
    if world.size == 1:
        return block
    return max(1, min(block, nocc // (COLUMN_BLOCKS_PER_RANK * world.size)))


def _ri_stage(mol, ri: FitBasis, channels: list[Channel], kernel_set, scales: Scales,
              occ_block: int | None, storage: GradientStorage,
              timings: dict[str, float], world: World, fitted: bool = True) -> RiStage:
    """B, the amplitude sweep and, when ``fitted``, G and V for the RI pass (the unrelaxed
    density needs only the sweep's P_ij and P_ab)."""
    clock = time.perf_counter
    t0 = clock()
    stores = _fitted_tensors(mol, ri, channels, kernel_set, storage, world)
    timings["ri_tensor"] = clock() - t0
    gammas: list = []
    opened: list = []
    try:
        t0 = clock()
        readers = [BlockReader(store, len(c.virtual), kernel_set.dtype, kernel_set.device)
                   for store, c in zip(stores, channels)]
        e_occ = [torch.as_tensor(c.mo_energy[c.active], device=kernel_set.device)
                 for c in channels]
        e_vir = [torch.as_tensor(c.mo_energy[c.virtual], device=kernel_set.device)
                 for c in channels]
        nocc = [len(c.active) for c in channels]
        nvir = [len(c.virtual) for c in channels]
        dealt = deal_column_blocks(nocc, nvir,
                                   _occ_block(channels, kernel_set, occ_block, storage, world),
                                   world)
        # Gamma (naux x nocc nvir, the size of B) is combined through scratch files, not an
        # allreduce: each column block is finished by the one rank that sweeps it, so there
        # is nothing to sum, and an allreduce would hold the whole of Gamma on every rank.
        # Each rank keeps its blocks in its own file; the RI pass reads rows from all of them.
        for n, store in enumerate(stores):
            columns = [[(k0 * nvir[n], k1 * nvir[n]) for col, (k0, k1) in batch if col == n]
                       for batch in dealt]
            gammas.append(ColumnSplit(f"gamma{n}", *store.shape, columns, world, storage.open))
            opened.append(gammas[-1])
        amplitudes = amplitude_intermediates(readers, gammas, e_occ, e_vir, kernel_set,
                                             dealt[world.rank], scales, storage.row_block,
                                             world)
        timings["amplitudes"] = clock() - t0
        if not fitted:
            for store in opened:
                store.close()
            return RiStage(amplitudes, [], np.zeros((0, 0)))
        t0 = clock()
        coupling = sum(c.occupancy * _coupling(store, gamma, storage.block_bytes)
                       for c, store, gamma in zip(channels, stores, gammas))
        coupling = torch.from_numpy(world.allreduce_sum(coupling.numpy(),
                                                        "summing the RI coupling"))
        for store in stores:
            store.close()
        v_ri = fitted_form(ri.metric, fitted_form(ri.metric, coupling).T).numpy()
        gammas = [_fit(ri.metric, gamma, storage, f"gfit{n}", opened, world)
                  for n, gamma in enumerate(gammas)]
    except BaseException:
        for store in opened:
            store.close()
        raise
    finally:
        for store in stores:
            store.close()
    timings["ri_fit"] = clock() - t0
    return RiStage(amplitudes, gammas, 0.5 * (v_ri + v_ri.T))


def _ri_derivatives(mol, ri: FitBasis, channels: list[Channel], stage: RiStage,
                    functions: int, world: World, derivatives: bool
                    ) -> tuple[list[tuple[np.ndarray, np.ndarray]], np.ndarray | None]:
    """The RI pass over G (whose stores it closes): the halves of X per channel and, with
    ``derivatives``, the RI derivative-integral gradient, two-index terms included."""
    ri_channels = [RiChannel(torch.from_numpy(np.ascontiguousarray(c.mo_coeff[:, c.active])),
                             torch.from_numpy(np.ascontiguousarray(c.mo_coeff[:, c.virtual])),
                             g, c.occupancy) for c, g in zip(channels, stage.gamma_fit)]
    try:
        halves, grad_ri = ri_pass(mol, ri.auxmol, ri_channels, functions, world, derivatives)
    finally:
        for store in stage.gamma_fit:
            store.close()
    if not derivatives:
        return halves, None
    return halves, grad_ri + two_index_gradient(ri.auxmol, stage.v_ri, mol.natm, world)


def _response(mf, channels: list[Channel], stage: RiStage,
              halves: list[tuple[np.ndarray, np.ndarray]]) -> tuple[RelaxedDensities, int]:
    """The relaxed densities, and the J/K builds the orbital response took."""
    potential = ScfPotential(mf, closed_shell=len(channels) == 1)
    relaxed = relax(channels, potential,
                    [orbital_derivative(c, xo, xv) for c, (xo, xv) in zip(channels, halves)],
                    [p.cpu().numpy() for p in stage.amplitudes.p_occ],
                    [p.cpu().numpy() for p in stage.amplitudes.p_vir])
    return relaxed, potential.builds


def scf_density(channel: Channel) -> np.ndarray:
    c_occ = channel.mo_coeff[:, channel.occupied]
    return channel.occupancy * c_occ @ c_occ.T


def reference_channels(mf, nfrozen: int) -> list[Channel]:
    """The spin channels of the converged SCF ``mf`` with the lowest ``nfrozen`` occupied
    orbitals of each spin frozen. A spin may have no electron, or none left active (the beta
    spin of H2+, of high-spin H3): it then pairs with nothing; each needs virtual orbitals."""
    if not getattr(mf, "converged", False):
        raise RunFailure("the SCF is not converged: its MP2 density and gradient would be "
                         "meaningless")
    channels = split_channels(mf.mo_energy, mf.mo_coeff, mf.mo_occ, nfrozen)
    spins = ["closed-shell"] if len(channels) == 1 else ["alpha", "beta"]
    for spin, channel in zip(spins, channels):
        occupied, virtual = len(channel.occupied), len(channel.virtual)
        if virtual == 0:
            raise InputError(
                f"the {spin} orbitals are all occupied: the MP2 density, properties, gradient "
                "and frequencies need virtual orbitals of each spin; choose a larger basis "
                "(the energy alone: dfmp2 run)")
        if nfrozen < 0 or nfrozen > occupied:
            raise InputError(f"cannot freeze {nfrozen} of the {occupied} occupied {spin} "
                             "orbitals")
    return channels


def ri_fit(mol, ri_aux: AuxBasis | str | dict | None) -> FitBasis:
    """The MP2 fitting basis (default: the RI partner of the orbital basis) and its metric."""
    ri = fit_basis(mol, ri_basis(mol, None) if ri_aux is None else as_aux(ri_aux))
    if ri.metric.kind != "cholesky":
        log.warning("the RI metric is not positive definite: the relaxed density and gradient "
                    "of the eigen-truncated fit are approximate")
    return ri


@dataclass
class DensityStages:
    """What stages 1-4 hand on: the amplitude sweep's densities and energies, the relaxed
    densities with the J/K builds of their response, the RI derivative-integral gradient
    (None unless asked for), and the stage timings."""

    amplitudes: AmplitudeIntermediates
    relaxed: RelaxedDensities
    jk_builds: int
    grad_ri: np.ndarray | None
    timings: dict[str, float] = field(default_factory=dict)


def density_stages(mf, channels: list[Channel], ri: FitBasis, kernel_set, scales: Scales,
                   occ_block: int | None, storage: GradientStorage, world: World,
                   derivatives: bool) -> DensityStages:
    """Stages 1-4 on the converged SCF ``mf``: the relaxed MP2 densities of the method with
    ``scales``, and with ``derivatives`` the RI derivative-integral gradient on the way."""
    clock = time.perf_counter
    timings: dict[str, float] = {}
    mol = mf.mol
    stage = _ri_stage(mol, ri, channels, kernel_set, scales, occ_block, storage, timings, world)
    t0 = clock()
    functions = aux_block_functions(mol.nao_nr(), storage.block_bytes)
    halves, grad_ri = _ri_derivatives(mol, ri, channels, stage, functions, world, derivatives)
    timings["ri_derivatives"] = clock() - t0
    t0 = clock()
    relaxed, jk_builds = _response(mf, channels, stage, halves)
    timings["response"] = clock() - t0
    return DensityStages(stage.amplitudes, relaxed, jk_builds, grad_ri, timings)


def unrelaxed_corrections(channels: list[Channel],
                          amplitudes: AmplitudeIntermediates) -> list[np.ndarray]:
    """P_ij and P_ab per channel in the AO basis (spin-summed for a closed shell)."""
    corrections = []
    for channel, p_occ, p_vir in zip(channels, amplitudes.p_occ, amplitudes.p_vir):
        p = np.zeros((channel.nmo, channel.nmo))
        p[np.ix_(channel.active, channel.active)] = p_occ.cpu().numpy()
        p[np.ix_(channel.virtual, channel.virtual)] = p_vir.cpu().numpy()
        corrections.append(channel.to_ao(p))
    return corrections


@dataclass
class Mp2Densities:
    """The AO one-particle density of an MP2 method per channel (spin-summed for a closed
    shell; alpha, beta for UHF), ``relaxed`` or not: the SCF's density (``scf``) plus the MP2
    correction (``total``); the method's energies and, relaxed, how its Z-vector was solved."""

    relaxed: bool
    total: list[np.ndarray]
    scf: list[np.ndarray]
    e_scf: float
    e_os: float
    e_ss: float
    scales: tuple[float, float]
    response: ResponseSolve | None = None
    jk_builds: int = 0
    out_of_core: bool = False
    timings: dict[str, float] = field(default_factory=dict)

    @property
    def e_corr(self) -> float:
        return self.scales[0] * self.e_os + self.scales[1] * self.e_ss

    @property
    def e_tot(self) -> float:
        return self.e_scf + self.e_corr


@torch_owns_the_cores()
def mp2_densities(mf, nfrozen: int = 0, ri_aux: AuxBasis | str | dict | None = None,
                  kernel_set=None, scs: tuple[float, float] = (1.0, 1.0),
                  occ_block: int | None = None, budget: int | None = None,
                  scratch: ScratchArea | None = None, world: World | None = None,
                  relaxed: bool = True) -> Mp2Densities:
    """The relaxed (or unrelaxed) density of E_SCF + c_os E_OS + c_ss E_SS on the converged
    SCF ``mf`` (RHF or UHF, density-fitted or conventional: the response uses its own J/K),
    through the gradient's own stages without its derivative integrals. The arguments are
    :func:`dfmp2.grad.kernel.kernel`'s; a single atom is allowed."""
    world = world or World()
    channels = reference_channels(mf, nfrozen)
    kernel_set = kernel_set if kernel_set is not None else kernels.load("torch", "fp64")
    scales = Scales(*scs)
    ri = ri_fit(mf.mol, ri_aux)
    storage = plan_storage(channels, ri.metric.naux_fit, 0, mf.mol.nao_nr(), budget,
                           None if scratch is None else scratch.area("density"), world)
    response, jk_builds = None, 0
    if relaxed:
        stages = density_stages(mf, channels, ri, kernel_set, scales, occ_block, storage, world,
                                derivatives=False)
        amplitudes, timings = stages.amplitudes, stages.timings
        corrections = stages.relaxed.p_relaxed
        response, jk_builds = stages.relaxed.response, stages.jk_builds
    else:
        timings = {}
        amplitudes = _ri_stage(mf.mol, ri, channels, kernel_set, scales, occ_block, storage,
                               timings, world, fitted=False).amplitudes
        corrections = unrelaxed_corrections(channels, amplitudes)
    scf = [scf_density(c) for c in channels]
    return Mp2Densities(relaxed, [d + p for d, p in zip(scf, corrections)], scf,
                        float(mf.e_tot), amplitudes.e_os, amplitudes.e_ss,
                        (scales.os, scales.ss), response, jk_builds, storage.out_of_core,
                        timings)
