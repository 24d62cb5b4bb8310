"""PySCF's own answers: its DF-MP2 on given orbitals (``--check`` of an MP2 run), and its whole
recipe from the molecule (``compare --reference pyscf``, and ``--check`` of a double hybrid):
its SCF with its own density fitting, then its DF-MP2, scaled for a double hybrid."""
from __future__ import annotations

import time
from dataclasses import dataclass

from pyscf import df
from pyscf import scf
from pyscf.mp import dfmp2 as pyscf_dfmp2
from pyscf.mp import dfump2 as pyscf_dfump2

from dfmp2.input.calculation import Calculation
from dfmp2.errors import RunFailure
from dfmp2.scf.reference import ScfOptions, run_scf

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


@dataclass(frozen=True)
class RecipeEnergies:
    """PySCF from the molecule: its SCF (Kohn-Sham for a double hybrid), its DF-MP2 parts, and
    the method's total (E_SCF + E_corr, or the double hybrid's scaled sum)."""

    e_scf: float
    mp2: ReferenceEnergies
    e_tot: float
    seconds: float


def pyscf_recipe(calc: Calculation, label: str) -> RecipeEnergies:
    """PySCF's SCF for ``calc`` (its own J/K, the same functional and grid), then its DF-MP2 with
    the same auxiliary basis and frozen core."""
    start = time.perf_counter()
    reference = run_scf(calc, ScfOptions(engine="pyscf"))
    if not reference.converged:
        raise RunFailure(f"PySCF's SCF for {label} did not converge")
    energies = pyscf_dfmp2_energy(reference.mf, calc.nfrozen, calc.auxbasis.spec)
    functional = calc.functional
    e_tot = (functional.total(reference.e_tot, energies.e_os, energies.e_ss) if functional
             else reference.e_tot + energies.e_corr)
    return RecipeEnergies(reference.e_tot, energies, e_tot, time.perf_counter() - start)
