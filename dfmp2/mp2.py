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
from dfmp2.b_store import open_store
from dfmp2.df_tensors import build_fitted_tensor
from dfmp2.energy import BlockReader, Mp2Energies, energy_sums
from dfmp2.errors import InputError
from dfmp2.memory import default_budget
from dfmp2.metric import build_metric
from dfmp2.planner import BlockPlan, plan_blocks

log = logging.getLogger(__name__)


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
    nocc: int
    nvir: int
    nfrozen: int
    metric_kind: str
    plan: BlockPlan
    timings: dict[str, float] = field(default_factory=dict)


def kernel(mol: gto.Mole, mo_energy: np.ndarray, mo_coeff: np.ndarray, mo_occ: np.ndarray,
           nfrozen: int, auxbasis: str | dict, kern, budget: int, fused: bool,
           occ_block: int | None = None, show_progress: bool | None = None,
           scratch_dir: Path | None = None, force_out_of_core: bool = False,
           finished: dict | None = None, on_pair=None, on_plan=None) -> Mp2Result:
    """DF-MP2 correlation energy of a closed-shell reference through the kernel set ``kern``.

    B stays in memory when the budget allows, else in an HDF5 scratch file in ``scratch_dir``.
    ``finished``/``on_pair`` resume and checkpoint block pairs (see ``energy.energy_sums``);
    ``on_plan`` sees the block plan before any integral is computed.
    """
    timings: dict[str, float] = {}
    occupied = np.flatnonzero(mo_occ > 0)
    virtual = np.flatnonzero(mo_occ == 0)
    if not 0 <= nfrozen < len(occupied):
        raise InputError(f"cannot freeze {nfrozen} of {len(occupied)} occupied orbitals")
    active = occupied[nfrozen:]
    if len(virtual) == 0:
        raise InputError("the basis has no virtual orbitals: MP2 needs a larger basis")
    nocc, nvir, nao = len(active), len(virtual), mol.nao_nr()

    t0 = time.perf_counter()
    auxmol = make_auxmol(mol, auxbasis)
    metric = build_metric(auxmol)
    timings["metric"] = time.perf_counter() - t0

    itemsize = torch.tensor([], dtype=kern.dtype).element_size()
    plan = plan_blocks(nocc, nvir, metric.naux_fit, nao, itemsize, budget, fused, occ_block,
                       force_out_of_core)
    log.info("sizes: nao=%d naux=%d nocc=%d nvir=%d nfrozen=%d; occupied block %d; B %s",
             nao, metric.naux, nocc, nvir, nfrozen, plan.occ_block,
             "out of core" if plan.out_of_core else "in memory")

    if on_plan is not None:
        on_plan(plan)
    store_factory = partial(open_store, out_of_core=plan.out_of_core, scratch_dir=scratch_dir)
    store = build_fitted_tensor(mol, auxmol, mo_coeff[:, active], mo_coeff[:, virtual], metric,
                                kern, plan.build_block_bytes, store_factory, timings)
    try:
        t0 = time.perf_counter()
        reader = BlockReader(store, nvir, kern.dtype, kern.device)
        e_occ = torch.as_tensor(mo_energy[active], dtype=torch.float64, device=kern.device)
        e_vir = torch.as_tensor(mo_energy[virtual], dtype=torch.float64, device=kern.device)
        energies = energy_sums(reader, e_occ, e_vir, kern, plan.occ_block, fused, show_progress,
                               finished, on_pair)
        timings["energy"] = time.perf_counter() - t0
    finally:
        store.close()
    return Mp2Result(energies, nao, metric.naux, metric.naux_fit, nocc, nvir, nfrozen,
                     metric.kind, plan, timings)


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
