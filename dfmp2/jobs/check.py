"""PySCF's own answers: its DF-MP2 on given orbitals (``--check`` of an MP2 run), and its whole
recipe from the molecule (``compare --reference pyscf``, and ``--check`` of a double hybrid):
its SCF with its own density fitting (the same JK-fit basis), then its DF-MP2, scaled for a
double hybrid, plus the functional's dispersion from the same library (dftd3 or dftd4)."""
from __future__ import annotations

import copy
import time
from dataclasses import dataclass

import pyscf
from pyscf import df, lib, scf
from pyscf.mp import dfmp2 as pyscf_dfmp2
from pyscf.mp import dfump2 as pyscf_dfump2

from dfmp2.errors import RunFailure
from dfmp2.input.calculation import Calculation
from dfmp2.jobs.stages import CalculationOutcome
from dfmp2.records.sections import CheckSection, write_timings
from dfmp2.records.tree import Node
from dfmp2.scf.reference import ScfOptions, run_scf

# The agreement promised against PySCF: fp64 to 1e-8 Eh, fp32 contraction to 1e-6 Eh.
TOLERANCE = {"fp64": 1e-8, "fp32": 1e-6}


# PySCF's DF-MP2 plans its blocks from what is left under its max_memory (by default the
# SCF's: the process's size then plus the budget), and raises MemoryError when nothing is: a
# process grown past that by the time of the reference (water dimer with --memory 20MB)
# failed its finished run. The reference gets at least this much (MB) above what the
# process holds, and goes out of core beyond it.
REFERENCE_MEMORY_MB = 500


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
    # Given an SCF without a DF object (--scf conventional), PySCF's constructor looks up
    # its own default RI basis, which raised KeyError for 6-31G** even with --auxbasis
    # given: a copy of the SCF carries the DF object it is to use.
    fitted = copy.copy(mf)
    fitted.with_df = df.DF(mf.mol, auxbasis=auxbasis)
    pt = method(fitted, frozen=nfrozen if nfrozen else None)
    pt.max_memory = max(mf.max_memory, lib.current_memory()[0] + REFERENCE_MEMORY_MB)
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


def pyscf_recipe(calc: Calculation, label: str,
                 follow_instability: bool = False) -> RecipeEnergies:
    """PySCF's SCF for ``calc`` (its own J/K with the same JK-fit basis, the same functional and
    grid; its instabilities followed as ours were), then its DF-MP2 with the same auxiliary
    basis and frozen core, plus the dispersion energy the library gave the calculation."""
    start = time.perf_counter()
    reference = run_scf(calc, ScfOptions(engine="pyscf", follow_instability=follow_instability))
    if not reference.converged:
        raise RunFailure(f"PySCF's SCF for {label} did not converge")
    energies = pyscf_dfmp2_energy(reference.mf, calc.nfrozen, calc.auxbasis.spec)
    functional = calc.functional
    e_tot = (functional.total(reference.e_tot, energies.e_os, energies.e_ss, calc.e_disp)
             if functional else reference.e_tot + energies.e_corr)
    return RecipeEnergies(reference.e_tot, energies, e_tot, time.perf_counter() - start)


def run_check(calc: Calculation, outcome: CalculationOutcome, precision: str,
              node: Node, follow_instability: bool = False) -> bool:
    """``--check``: PySCF's DF-MP2 on the same orbitals, auxiliary basis and frozen core; for
    a double hybrid, PySCF's whole recipe (its own Kohn-Sham SCF with the same functional
    and grid, its DF-MP2, scaled), compared on the total energy too."""
    if calc.functional is not None:
        return _check_recipe(calc, outcome, precision, node, follow_instability)
    reference = pyscf_dfmp2_energy(outcome.scf.mf, calc.nfrozen, calc.auxbasis.spec)
    tolerance = TOLERANCE[precision]
    delta = outcome.mp2.energies.e_corr - reference.e_corr
    passed = abs(delta) <= tolerance
    CheckSection(f"pyscf {pyscf.__version__} DFMP2/DFUMP2 (with_t2=False)", reference.e_corr,
                 reference.e_os, reference.e_ss, outcome.scf.e_tot + reference.e_corr, delta,
                 tolerance, passed, reference.seconds).write(node)
    write_timings(node, {"reference": reference.seconds})
    return passed


def _check_recipe(calc: Calculation, outcome: CalculationOutcome, precision: str,
                  node: Node, follow_instability: bool) -> bool:
    recipe = pyscf_recipe(calc, "the check", follow_instability)
    energies = outcome.mp2.energies
    e_tot = calc.functional.total(outcome.scf.e_tot, energies.e_os, energies.e_ss, calc.e_disp)
    tolerance = TOLERANCE[precision]
    delta_corr, delta_tot = energies.e_corr - recipe.mp2.e_corr, e_tot - recipe.e_tot
    passed = abs(delta_corr) <= tolerance and abs(delta_tot) <= tolerance
    dispersion = calc.functional.dispersion
    added = f", plus {dispersion.describe()}" if dispersion else ""
    CheckSection(f"pyscf {pyscf.__version__} DF-{calc.reference_name.upper()} "
                 f"({calc.functional.xc}) then DFMP2/DFUMP2, scaled{added}", recipe.mp2.e_corr,
                 recipe.mp2.e_os, recipe.mp2.e_ss, recipe.e_tot, delta_corr, tolerance, passed,
                 recipe.seconds, recipe.e_scf, delta_tot).write(node)
    write_timings(node, {"reference": recipe.seconds})
    return passed
