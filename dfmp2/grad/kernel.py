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
5. The JK-fit derivative terms of the SCF and the relaxed density
   (:func:`dfmp2.grad.integrals.jk_pass`), then the one-electron, overlap and nuclear
   terms.

B, Gamma and the JK pass's half-transformed integrals live in memory or, when they would take
more than half the memory budget, in scratch files (:func:`plan_storage`).

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

import logging
import time
from dataclasses import dataclass, field

import numpy as np
import torch
from pyscf import df

import kernels
from dfmp2.df.auxbasis import AuxBasis, describe, make_auxmol, ri_basis
from dfmp2.df.store import ScratchArea, open_store
from dfmp2.system.blas_threads import torch_owns_the_cores
from dfmp2.df.fitted import build_fitted_tensors
from dfmp2.system.disk import check_space
from dfmp2.mp2.pairs import BlockReader
from dfmp2.errors import InputError, RunFailure
from dfmp2.grad.amplitudes import (MAX_SLAB_BYTES, AmplitudeIntermediates, Scales,
                                   amplitude_intermediates, deal_column_blocks,
                                   gradient_occ_block)
from dfmp2.grad.integrals import (DERIVATIVE_BLOCK_ARRAYS, JkChannel, RiChannel,
                                      aux_block_functions, jk_pass, one_electron_gradient,
                                      ri_pass, two_index_gradient)
from dfmp2.grad.response import (RelaxedDensities, ResponseSolve, ScfPotential,
                                 orbital_derivative, relax)
from dfmp2.grad.sharing import ColumnSplit
from dfmp2.system.distributed import World
from dfmp2.system.memory import (FP64_BYTES, GRADIENT_TENSORS_IN_MEMORY_SHARE, fits_in_memory,
                                 format_size)
from dfmp2.df.metric import JK_LINDEP_THRESHOLD, FitMetric
from dfmp2.mp2.channels import Channel, split_channels
from dfmp2.mp2.kernel import FitBasis, fit_basis

log = logging.getLogger(__name__)

# Work memory of the integral sweeps: one auxiliary block's raw and derivative integrals.
DEFAULT_BLOCK_BYTES = 256 * 2**20
# Column blocks of the amplitude sweep per rank at least, so that dealing them by cost can
# even out the ranks' loads.
COLUMN_BLOCKS_PER_RANK = 2


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
    relaxed_densities: list[np.ndarray] = field(default_factory=list)
    """Per channel the AO density of the differentiated energy: the SCF's plus the relaxed
    MP2 correction (spin-summed for a closed shell; alpha, beta for UHF)."""


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


@dataclass(frozen=True)
class GradientStorage:
    """Where the gradient's large tensors live: B and Gamma of the RI basis per channel and
    the JK pass's half-transformed integrals, in memory or (``scratch``) in scratch files;
    the work memory of one auxiliary block of the integral sweeps (``block_bytes``), the slab
    of the amplitude sweep and the occupied orbitals of B read at once for a slab's rows
    (``row_block``: all when B is in memory)."""

    scratch: ScratchArea | None = None
    block_bytes: int = DEFAULT_BLOCK_BYTES
    slab_bytes: int = MAX_SLAB_BYTES
    row_block: int | None = None
    tag: str = ""
    """Added to this rank's file names when several ranks share the scratch folder."""

    @property
    def out_of_core(self) -> bool:
        return self.scratch is not None

    def open(self, name: str, naux: int, ncols: int):
        return open_store(naux, ncols, None if self.scratch is None
                          else self.scratch.named(name + self.tag))


def held_bytes(channels: list[Channel], naux_ri: int, naux_jk: int, nao: int) -> int:
    """Bytes of the tensors :class:`GradientStorage` places: B and Gamma (fp64) per channel
    and the JK pass's half-transformed integrals."""
    ri = sum(2 * naux_ri * len(c.active) * len(c.virtual) for c in channels)
    jk = sum(naux_jk * nao * len(c.occupied) for c in channels)
    return FP64_BYTES * (ri + jk)


def check_budget(nocc: int, nvir: int, naux_ri: int, nao: int, budget: int) -> None:
    """Refuse a budget below the gradient's smallest work blocks: one occupied orbital per
    slab column and per read of B's rows, one auxiliary function per integral block."""
    minimum = FP64_BYTES * (4 * nocc * nvir * nvir + 3 * naux_ri * nvir
                            + DERIVATIVE_BLOCK_ARRAYS * nao * nao)
    if budget < minimum:
        raise InputError(f"memory budget {format_size(budget)} is too small for this gradient: "
                         f"at least {format_size(minimum)} is needed; raise --memory")


def plan_storage(channels: list[Channel], naux_ri: int, naux_jk: int, nao: int,
                 budget: int | None, scratch: ScratchArea | None,
                 world: World | None = None) -> GradientStorage:
    """In memory while the placed tensors take at most half of ``budget`` (always without a
    budget); otherwise in scratch files, with the work blocks shrunk to fit the budget. With
    several ranks always in scratch files: the ranks share B and read each other's shares of
    Gamma and of the JK pass's integrals through them."""
    world = world or World()
    held = held_bytes(channels, naux_ri, naux_jk, nao)
    distributed = world.size > 1
    if budget is None and not distributed:
        return GradientStorage()
    block_bytes = DEFAULT_BLOCK_BYTES if budget is None else min(DEFAULT_BLOCK_BYTES,
                                                                 budget // 4)
    if not distributed and fits_in_memory(held, budget, GRADIENT_TENSORS_IN_MEMORY_SHARE):
        return GradientStorage(block_bytes=block_bytes)
    if scratch is None:
        needs = ("the ranks of a distributed gradient share its tensors through scratch "
                 "files" if distributed else
                 f"the gradient's tensors ({format_size(held)}) do not fit in "
                 f"{format_size(budget)}")
        raise InputError(f"{needs} and no scratch folder was given")
    nvir = max(len(c.virtual) for c in channels)
    slab_bytes = MAX_SLAB_BYTES
    if budget is not None:
        check_budget(max(len(c.active) for c in channels), nvir, naux_ri, nao, budget)
        slab_bytes = min(MAX_SLAB_BYTES, budget // 16)
    row_block = max(1, slab_bytes // (FP64_BYTES * naux_ri * nvir))
    check_space(scratch.folder, held, "the gradient's tensors")
    log.info("gradient tensors (%s) in scratch files under %s", format_size(held),
             scratch.folder)
    return GradientStorage(scratch, block_bytes, slab_bytes, row_block,
                           f".rank{world.rank}" if distributed else "")


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
              timings: dict[str, float], world: World) -> RiStage:
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


def _checked_channels(mf, nfrozen: int,
                      jk_aux: AuxBasis | str | dict | None) -> tuple[AuxBasis, list[Channel]]:
    """The JK-fit basis and the spin channels of ``mf``, once it is a reference whose
    gradient means something."""
    if mf.mol.natm < 2:
        raise InputError("a gradient needs at least two atoms")
    if not getattr(mf, "converged", False):
        raise RunFailure("the SCF is not converged: its gradient would be meaningless")
    jk = scf_jk_basis(mf)
    if jk_aux is not None and _as_aux(jk_aux).spec != jk.spec:
        raise InputError(f"the JK-fit basis {_as_aux(jk_aux).name} is not the one the SCF "
                         f"was converged with ({jk.name})")
    channels = split_channels(mf.mo_energy, mf.mo_coeff, mf.mo_occ, nfrozen)
    for channel in channels:
        if nfrozen < 0 or len(channel.active) == 0 or len(channel.virtual) == 0:
            raise InputError(f"cannot freeze {nfrozen} orbitals: every spin channel needs "
                             "active occupied and virtual orbitals")
    return jk, channels


def _ri_derivatives(mol, ri: FitBasis, channels: list[Channel], stage: RiStage,
                    functions: int, world: World
                    ) -> tuple[list[tuple[np.ndarray, np.ndarray]], np.ndarray]:
    """The RI pass over G (whose stores it closes): the halves of X per channel and the RI
    derivative-integral gradient, two-index terms included."""
    ri_channels = [RiChannel(torch.from_numpy(np.ascontiguousarray(c.mo_coeff[:, c.active])),
                             torch.from_numpy(np.ascontiguousarray(c.mo_coeff[:, c.virtual])),
                             g, c.occupancy) for c, g in zip(channels, stage.gamma_fit)]
    try:
        halves, grad_ri = ri_pass(mol, ri.auxmol, ri_channels, functions, world)
    finally:
        for store in stage.gamma_fit:
            store.close()
    grad_ri += two_index_gradient(ri.auxmol, stage.v_ri, mol.natm, world)
    return halves, grad_ri


def _response(mf, channels: list[Channel], stage: RiStage,
              halves: list[tuple[np.ndarray, np.ndarray]]) -> tuple[RelaxedDensities, int]:
    """The relaxed densities, and the J/K builds the orbital response took."""
    potential = ScfPotential(mf, closed_shell=len(channels) == 1)
    relaxed = relax(channels, potential,
                    [orbital_derivative(c, xo, xv) for c, (xo, xv) in zip(channels, halves)],
                    [p.cpu().numpy() for p in stage.amplitudes.p_occ],
                    [p.cpu().numpy() for p in stage.amplitudes.p_vir])
    return relaxed, potential.builds


def _scf_density(channel: Channel) -> np.ndarray:
    c_occ = channel.mo_coeff[:, channel.occupied]
    return channel.occupancy * c_occ @ c_occ.T


@torch_owns_the_cores()
def kernel(mf, nfrozen: int = 0, ri_aux: AuxBasis | str | dict | None = None,
           jk_aux: AuxBasis | str | dict | None = None, kernel_set=None,
           scs: tuple[float, float] = (1.0, 1.0), occ_block: int | None = None,
           budget: int | None = None, scratch: ScratchArea | None = None,
           world: World | None = None) -> GradientResult:
    """Energy and relaxed gradient of E_SCF + c_os E_OS + c_ss E_SS on the converged
    density-fitted SCF ``mf`` (RHF or UHF; its ``with_df`` is PySCF's DF or dfmp2's KernelDF),
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
    timings: dict[str, float] = {}
    mol = mf.mol
    jk, channels = _checked_channels(mf, nfrozen, jk_aux)
    kernel_set = kernel_set if kernel_set is not None else kernels.load("torch", "fp64")
    scales = Scales(*scs)
    ri = fit_basis(mol, ri_basis(mol, None) if ri_aux is None else _as_aux(ri_aux))
    if ri.metric.kind != "cholesky":
        log.warning("the RI metric is not positive definite: the gradient of the "
                    "eigen-truncated fit is approximate")

    jk_auxmol = make_auxmol(mol, jk)
    storage = plan_storage(channels, ri.metric.naux_fit, jk_auxmol.nao_nr(), mol.nao_nr(),
                           budget, None if scratch is None else scratch.area("gradient"), world)
    stage = _ri_stage(mol, ri, channels, kernel_set, scales, occ_block, storage, timings, world)
    t0 = clock()
    functions = aux_block_functions(mol.nao_nr(), storage.block_bytes)
    halves, grad_ri = _ri_derivatives(mol, ri, channels, stage, functions, world)
    timings["ri_derivatives"] = clock() - t0

    t0 = clock()
    relaxed, jk_builds = _response(mf, channels, stage, halves)
    timings["response"] = clock() - t0

    t0 = clock()
    jk_channels = [JkChannel(c.mo_coeff[:, c.occupied], p, c.occupancy)
                   for c, p in zip(channels, relaxed.p_relaxed)]
    grad_jk = jk_pass(mol, jk_auxmol, jk_channels, functions, JK_LINDEP_THRESHOLD, storage.open,
                      storage.block_bytes, world)
    timings["jk_derivatives"] = clock() - t0

    t0 = clock()
    densities = [_scf_density(c) + p for c, p in zip(channels, relaxed.p_relaxed)]
    grad_1e = one_electron_gradient(mol, sum(densities), relaxed.w_total, world)
    timings["one_electron"] = clock() - t0

    energies = stage.amplitudes
    e_corr = scales.os * energies.e_os + scales.ss * energies.e_ss
    e_scf = float(mf.e_tot)
    return GradientResult(e_scf + e_corr, e_scf, e_corr, energies.e_os, energies.e_ss,
                          (scales.os, scales.ss), grad_1e + grad_jk + grad_ri, timings,
                          jk_builds, storage.out_of_core, relaxed.response, energies.ranks,
                          densities)
