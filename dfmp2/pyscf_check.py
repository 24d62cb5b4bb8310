"""PySCF's own DF-MP2 on the same orbitals, auxiliary basis and frozen core (for --check)."""
from __future__ import annotations

import time
from dataclasses import dataclass

from pyscf import df
from pyscf import scf
from pyscf.mp import dfmp2 as pyscf_dfmp2
from pyscf.mp import dfump2 as pyscf_dfump2

# The agreement promised against PySCF: fp64 to 1e-8 Eh, fp32 contraction to 1e-6 Eh.
TOLERANCE = {"fp64": 1e-8, "fp32": 1e-6}


@dataclass(frozen=True)
class ReferenceEnergies:
    e_corr: float
    e_os: float
    e_ss: float
    seconds: float


def pyscf_dfmp2_energy(mf, nfrozen: int, auxbasis: str | dict) -> ReferenceEnergies:
    """PySCF DFMP2 (DFUMP2 for a UHF reference) with an explicit DF object: on a DF-SCF, PySCF
    would otherwise silently reuse the SCF's JK-fit basis; and ``with_t2=False`` avoids
    allocating O^2 V^2 amplitudes."""
    start = time.perf_counter()
    method = pyscf_dfump2.DFUMP2 if isinstance(mf, scf.uhf.UHF) else pyscf_dfmp2.DFMP2
    pt = method(mf, frozen=nfrozen if nfrozen else None)
    pt.with_df = df.DF(mf.mol, auxbasis=auxbasis)
    pt.verbose = 0
    pt.kernel(with_t2=False)
    return ReferenceEnergies(float(pt.e_corr), float(pt.e_corr_os), float(pt.e_corr_ss),
                             time.perf_counter() - start)
