"""Closed-shell DF-MP2: a compact kernel function and a thin class around it."""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

import numpy as np
import torch
from pyscf import df, gto
from pyscf.data import elements

import kernels
from dfmp2.b_store import ScratchB, open_store
from dfmp2.distributed import World
from dfmp2.df_tensors import build_fitted_tensors
from dfmp2.energy import BlockReader, Mp2Energies, energy_sums
from dfmp2.errors import InputError
from dfmp2.memory import default_budget
from dfmp2.metric import build_metric
from dfmp2.planner import BlockPlan, plan_blocks

log = logging.getLogger(__name__)
# A distributed energy step wants several block pairs per rank to balance the load.
PAIRS_PER_RANK = 4


def default_auxbasis(mol: gto.Mole) -> str | dict:
    """The RI (MP2-fit) partner of the orbital basis."""
    return df.make_auxbasis(mol, mp2fit=True)


def auxbasis_name(auxbasis: str | dict) -> str:
    if isinstance(auxbasis, dict):
        names = sorted(set(map(str, auxbasis.values())))
        return names[0] if len(names) == 1 else ",".join(f"{k}:{v}" for k, v in
                                                          sorted(auxbasis.items()))
    return str(auxbasis)


def make_auxmol(mol: gto.Mole, auxbasis: str | dict) -> gto.Mole:
    try:
        return df.addons.make_auxmol(mol, auxbasis)
    except (RuntimeError, KeyError, ValueError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise InputError(f"auxiliary basis '{auxbasis_name(auxbasis)}' cannot be used for this "
                         f"molecule ({first.strip()}); choose another with --auxbasis") from None


def frozen_core_count(mol: gto.Mole) -> int:
    """PySCF's standard number of core orbitals for the molecule's elements."""
    return int(elements.chemcore(mol))


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

    @property
    def open_shell(self) -> bool:
        return len(self.nocc) == 2


@dataclass(frozen=True)
class SpinChannel:
    """Active occupied and virtual orbitals of one spin (or of the closed shell)."""

    c_occ: np.ndarray
    c_vir: np.ndarray
    e_occ: np.ndarray
    e_vir: np.ndarray


def spin_channels(mo_energy: np.ndarray, mo_coeff: np.ndarray, mo_occ: np.ndarray,
                  nfrozen: int) -> list[SpinChannel]:
    """One channel for RHF orbitals (2-D ``mo_coeff``), two (alpha, beta) for UHF (3-D)."""
    if np.ndim(mo_coeff) == 2:
        mo_energy, mo_coeff, mo_occ = [mo_energy], [mo_coeff], [mo_occ]
    channels = []
    for energy, coeff, occ in zip(mo_energy, mo_coeff, mo_occ):
        occupied = np.flatnonzero(np.asarray(occ) > 0)
        virtual = np.flatnonzero(np.asarray(occ) == 0)
        if not 0 <= nfrozen <= len(occupied):
            raise InputError(f"cannot freeze {nfrozen} of {len(occupied)} occupied orbitals")
        if len(virtual) == 0:
            raise InputError("the basis has no virtual orbitals: MP2 needs a larger basis")
        active = occupied[nfrozen:]
        channels.append(SpinChannel(np.asarray(coeff)[:, active], np.asarray(coeff)[:, virtual],
                                    np.asarray(energy)[active], np.asarray(energy)[virtual]))
    if all(len(c.e_occ) == 0 for c in channels):
        raise InputError(f"cannot freeze {nfrozen} of {len(channels[0].e_occ) + nfrozen} occupied "
                         "orbitals: none would be left")
    return channels


def kernel(mol: gto.Mole, mo_energy: np.ndarray, mo_coeff: np.ndarray, mo_occ: np.ndarray,
           nfrozen: int, auxbasis: str | dict, kern, budget: int, fused: bool,
           occ_block: int | None = None, show_progress: bool | None = None,
           scratch_dir: Path | None = None, force_out_of_core: bool = False,
           finished: dict | None = None, on_pair=None, on_plan=None,
           world: World | None = None, rank_log: dict | None = None) -> Mp2Result:
    """DF-MP2 correlation energy of an RHF or UHF reference through the kernel set ``kern``.

    B stays in memory when the budget allows, else in an HDF5 scratch file in ``scratch_dir``.
    ``finished``/``on_pair`` resume and checkpoint block pairs (see ``energy.energy_sums``);
    ``on_plan`` sees the block plan before any integral is computed. With a ``world`` of
    several ranks, rank 0 builds B into a scratch file the others read, and the block pairs are
    shared out (see ``energy.energy_sums``).
    """
    world = world or World()
    force_out_of_core = force_out_of_core or world.size > 1
    timings: dict[str, float] = {}
    channels = spin_channels(mo_energy, mo_coeff, mo_occ, nfrozen)
    sizes = [(len(c.e_occ), len(c.e_vir)) for c in channels]
    nao = mol.nao_nr()

    t0 = time.perf_counter()
    auxmol = make_auxmol(mol, auxbasis)
    metric = build_metric(auxmol)
    timings["metric"] = time.perf_counter() - t0

    itemsize = torch.tensor([], dtype=kern.dtype).element_size()
    plan = plan_blocks(sizes, metric.naux_fit, nao, itemsize, budget, fused, occ_block,
                       force_out_of_core,
                       min_pairs=PAIRS_PER_RANK * world.size if world.size > 1 else 1)
    log.info("sizes: nao=%d naux=%d (nocc, nvir)=%s nfrozen=%d; occupied block %d; B %s",
             nao, metric.naux, sizes, nfrozen, plan.occ_block,
             "out of core" if plan.out_of_core else "in memory")
    if on_plan is not None:
        on_plan(plan)

    store_factory = partial(open_store, out_of_core=plan.out_of_core, scratch_dir=scratch_dir)
    stores = []
    if world.is_root:
        stores = build_fitted_tensors(mol, auxmol, [(c.c_occ, c.c_vir) for c in channels],
                                      metric, kern, plan.build_block_bytes, store_factory,
                                      timings)
    if world.size > 1:
        paths = world.broadcast([store.share() for store in stores] if world.is_root else None,
                                "sharing the fitted tensor B")
        if not world.is_root:
            stores = [ScratchB.open_shared(path) for path in paths]
    try:
        t0 = time.perf_counter()
        readers = [BlockReader(store, len(c.e_vir), kern.dtype, kern.device)
                   for store, c in zip(stores, channels)]

        def energies_of(values: np.ndarray) -> torch.Tensor:
            return torch.as_tensor(values, dtype=torch.float64, device=kern.device)

        energies = energy_sums(readers, [energies_of(c.e_occ) for c in channels],
                               [energies_of(c.e_vir) for c in channels], kern, plan.occ_block,
                               fused, show_progress, finished, on_pair, world, rank_log)
        timings["energy"] = time.perf_counter() - t0
        world.barrier("finishing the energy step")
    finally:
        for store in stores:
            store.close()
    return Mp2Result(energies, nao, metric.naux, metric.naux_fit, [s[0] for s in sizes],
                     [s[1] for s in sizes], nfrozen, metric.kind, plan, timings)


class DFMP2:
    """DF-MP2 on a converged PySCF RHF object, in the manner of ``pyscf.mp.dfmp2.DFMP2``.

    >>> pt = DFMP2(mf, frozen=1); e_corr = pt.kernel()
    """

    def __init__(self, mf, frozen: int = 0, auxbasis: str | dict | None = None,
                 backend: str = "torch", precision: str = "fp64", fused_energy: bool = False,
                 memory: int | None = None, occ_block: int | None = None) -> None:
        self.mf = mf
        self.mol = mf.mol
        self.frozen = frozen
        self.auxbasis = auxbasis if auxbasis is not None else default_auxbasis(mf.mol)
        self.kern = kernels.load(backend, precision)
        self.fused_energy = fused_energy
        self.memory = memory if memory is not None else default_budget()
        self.occ_block = occ_block
        self.result: Mp2Result | None = None

    def kernel(self) -> float:
        self.result = kernel(self.mol, self.mf.mo_energy, self.mf.mo_coeff, self.mf.mo_occ,
                             self.frozen, self.auxbasis, self.kern, self.memory,
                             self.fused_energy, self.occ_block, show_progress=False)
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
