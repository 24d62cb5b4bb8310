"""DF-MP2 of an RHF or UHF reference: a compact kernel function and a thin class around it.

The kernel is handed everything decided before it runs: the orbitals, the fitting basis, the
kernel set, the block plan and where to work (:class:`Execution`). It decides nothing that
the caller needs back except the energies.
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from pyscf import gto

import kernels
from dfmp2.df.auxbasis import AuxBasis, make_auxmol, ri_basis
from dfmp2.df.store import ScratchArea
from dfmp2.system.blas_threads import torch_owns_the_cores
from dfmp2.df.fitted import build_fitted_tensors
from dfmp2.system.distributed import World
from dfmp2.mp2.channels import SpinChannel, split_channels
from dfmp2.mp2.pairs import BlockReader, Mp2Energies, PairLedger, energy_sums
from dfmp2.errors import InputError
from dfmp2.system.memory import memory_budget
from dfmp2.df.metric import FitMetric, build_metric
from dfmp2.mp2.plan import BlockPlan, plan_blocks

log = logging.getLogger(__name__)
# A distributed energy step wants several block pairs per rank to balance the load.
PAIRS_PER_RANK = 4


@dataclass(frozen=True)
class Orbitals:
    """A converged reference: RHF (2-D ``mo_coeff``) or UHF (3-D), and how many of the lowest
    occupied orbitals of each spin are frozen."""

    mo_energy: np.ndarray
    mo_coeff: np.ndarray
    mo_occ: np.ndarray
    nfrozen: int = 0

    def channels(self) -> list[SpinChannel]:
        """One channel for RHF, two (alpha, beta) for UHF (ROHF is refused by
        :func:`split_channels`), each with at least one virtual orbital and the frozen ones
        taken from its occupied orbitals."""
        channels = []
        for channel in split_channels(self.mo_energy, self.mo_coeff, self.mo_occ,
                                      self.nfrozen):
            if not 0 <= self.nfrozen <= len(channel.occupied):
                raise InputError(f"cannot freeze {self.nfrozen} of {len(channel.occupied)} "
                                 "occupied orbitals")
            if len(channel.virtual) == 0:
                raise InputError("the basis has no virtual orbitals: MP2 needs a larger basis")
            channels.append(SpinChannel.of(channel))
        if all(c.nocc == 0 for c in channels):
            raise InputError(f"cannot freeze {self.nfrozen} of {self.nfrozen} occupied "
                             "orbitals: none would be left")
        return channels

    def sizes(self) -> list[tuple[int, int]]:
        """(active occupied, virtual) per channel."""
        return [(c.nocc, c.nvir) for c in self.channels()]


@dataclass(frozen=True)
class FitBasis:
    """The auxiliary (RI) molecule and the factor of its Coulomb metric."""

    aux: AuxBasis
    auxmol: gto.Mole
    metric: FitMetric

    @property
    def naux(self) -> int:
        return self.metric.naux

    @property
    def naux_fit(self) -> int:
        return self.metric.naux_fit


def fit_basis(mol: gto.Mole, aux: AuxBasis) -> FitBasis:
    auxmol = make_auxmol(mol, aux)
    return FitBasis(aux, auxmol, build_metric(auxmol))


@dataclass(frozen=True)
class Execution:
    """Where the MP2 stage runs: the ranks, the scratch files (None keeps B in memory unless
    the plan says out of core, then in a private scratch folder), the pair ledger and whether
    to show progress."""

    world: World = field(default_factory=World)
    scratch: ScratchArea | None = None
    ledger: PairLedger = field(default_factory=PairLedger)
    show_progress: bool | None = None


@dataclass
class Mp2Result:
    energies: Mp2Energies
    nao: int
    naux: int
    naux_fit: int
    nocc: list[int]
    nvir: list[int]
    nfrozen: int
    metric_kind: str
    plan: BlockPlan
    timings: dict[str, float] = field(default_factory=dict)
    ranks: dict[int, tuple[list, float]] = field(default_factory=dict)

    @property
    def open_shell(self) -> bool:
        return len(self.nocc) == 2


def plan_for(sizes: list[tuple[int, int]], naux: int, nao: int, kernel_set, budget: int,
             fused: bool, occ_block: int | None, world_size: int = 1,
             force_out_of_core: bool = False) -> BlockPlan:
    """The block plan of an MP2 with ``sizes`` = [(active occupied, virtual), ...] per channel
    and ``naux`` fitted auxiliary functions: it needs only the sizes, so it can be made before
    the SCF. Distributed runs keep B out of core (the ranks share the scratch file) and want
    enough block pairs for every rank."""
    itemsize = torch.tensor([], dtype=kernel_set.dtype).element_size()
    return plan_blocks(sizes, naux, nao, itemsize, budget, fused, occ_block,
                       force_out_of_core=force_out_of_core or world_size > 1,
                       min_pairs=PAIRS_PER_RANK * world_size if world_size > 1 else 1,
                       ranks=world_size)


@torch_owns_the_cores()
def kernel(mol: gto.Mole, orbitals: Orbitals, fit: FitBasis, kernel_set, plan: BlockPlan,
           execution: Execution | None = None) -> Mp2Result:
    """DF-MP2 correlation energy through the kernel set ``kernel_set``.

    B stays in memory unless ``plan.out_of_core``; then it lives in ``execution.scratch``
    (with several ranks, every rank builds its share of it there and reads from it; the
    timings are this rank's own). Block pairs already in the ledger are not recomputed.
    """
    execution = execution if execution is not None else Execution()
    world = execution.world
    timings: dict[str, float] = {}
    channels = orbitals.channels()
    nao = mol.nao_nr()
    log.info("sizes: nao=%d naux=%d (nocc, nvir)=%s nfrozen=%d; occupied block %d; B %s",
             nao, fit.naux, [(c.nocc, c.nvir) for c in channels], orbitals.nfrozen,
             plan.occ_block, "out of core" if plan.out_of_core else "in memory")
    scratch = None
    if plan.out_of_core:
        if execution.scratch is None:
            raise ValueError("an out-of-core plan needs a scratch area")
        scratch = execution.scratch
    stores = build_fitted_tensors(mol, fit.auxmol, [(c.c_occ, c.c_vir) for c in channels],
                                  fit.metric, kernel_set, plan.build_block_bytes, scratch,
                                  timings, world)
    try:
        t0 = time.perf_counter()
        readers = [BlockReader(store, c.nvir, kernel_set.dtype, kernel_set.device)
                   for store, c in zip(stores, channels)]

        def energies_of(values: np.ndarray) -> torch.Tensor:
            return torch.as_tensor(values, dtype=torch.float64, device=kernel_set.device)

        energies, ranks = energy_sums(readers, [energies_of(c.e_occ) for c in channels],
                                      [energies_of(c.e_vir) for c in channels], kernel_set,
                                      plan.occ_block, plan.fused, execution.ledger, world,
                                      execution.show_progress)
        timings["energy"] = time.perf_counter() - t0
        world.barrier("finishing the energy step")
    finally:
        for store in stores:
            store.close()
    return Mp2Result(energies, nao, fit.naux, fit.naux_fit, [c.nocc for c in channels],
                     [c.nvir for c in channels], orbitals.nfrozen, fit.metric.kind, plan,
                     timings, ranks)


class DFMP2:
    """DF-MP2 on a converged PySCF RHF or UHF object, in the manner of
    ``pyscf.mp.dfmp2.DFMP2``.

    >>> pt = DFMP2(mf, frozen=1); e_corr = pt.kernel()
    """

    def __init__(self, mf, frozen: int = 0, auxbasis: str | None = None,
                 backend: str = "torch", precision: str = "fp64", fused_energy: bool = False,
                 memory: int | None = None, occ_block: int | None = None,
                 scratch_dir: Path | None = None) -> None:
        self.mf = mf
        self.mol = mf.mol
        self.frozen = frozen
        self.auxbasis = ri_basis(mf.mol, auxbasis)
        self.kernel_set = kernels.load(backend, precision)
        self.fused_energy = fused_energy
        self.memory = memory_budget(memory)
        self.occ_block = occ_block
        self.scratch_dir = scratch_dir
        self.result: Mp2Result | None = None

    def kernel(self, force_out_of_core: bool = False) -> float:
        orbitals = Orbitals(np.asarray(self.mf.mo_energy), np.asarray(self.mf.mo_coeff),
                            np.asarray(self.mf.mo_occ), self.frozen)
        fit = fit_basis(self.mol, self.auxbasis)
        plan = plan_for(orbitals.sizes(), fit.naux_fit, self.mol.nao_nr(), self.kernel_set,
                        self.memory, self.fused_energy, self.occ_block,
                        force_out_of_core=force_out_of_core)
        scratch = ScratchArea(self.scratch_dir or Path("."), f"dfmp2-{id(self):x}")
        self.result = kernel(self.mol, orbitals, fit, self.kernel_set, plan,
                             Execution(scratch=scratch, show_progress=False))
        return self.e_corr

    @property
    def e_corr(self) -> float:
        return self.result.energies.e_corr

    @property
    def e_corr_os(self) -> float:
        return self.result.energies.e_os

    @property
    def e_corr_ss(self) -> float:
        return self.result.energies.e_ss
