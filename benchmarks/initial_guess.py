"""SCF cycles and J/K builds under each way of starting and extrapolating the SCF (cc-pVDZ).

Every SCF is dfmp2's own (RHF or UHF, the JK-fit basis, J/K from our engine, 1e-12 Eh and a
1e-7 orbital gradient, BLAS threads as in ``dfmp2 run``); each option changes one thing
against the default: PySCF's initial guess (``init_guess``), a guess projected from an SCF in
a small basis, DIIS's space or first cycle, EDIIS/ADIIS in place of (or before) DIIS, the J/K
precision (the fp32 -> fp64 ladder against fp64 builds only), or the energy change of the
convergence test (from the density change, or PySCF's difference of two energies).

Prints, per molecule, cycles and builds (fp32 + fp64), then per option the totals over the
bundled molecules, the cycles of (H2O)16 when it is among the names, and the largest energy
difference from the old default (fp64 builds only, PySCF's energy difference and DIIS space
8), and the
seconds of the SCFs (the small-basis SCF of a projected guess not included; take them on a
quiet machine).

    python benchmarks/initial_guess.py                       # every option, 16 molecules
    python benchmarks/initial_guess.py --names water_16 --options sap,atom
"""
from __future__ import annotations

import argparse
import json
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from pyscf import scf
from pyscf.scf.diis import ADIIS, CDIIS, EDIIS

from dfmp2.input.calculation import CalculationRequest, define_calculation
from dfmp2.input.xyz import read_xyz
from dfmp2.scf.engine import scf_kernels
from dfmp2.scf.reference import ScfOptions, new_scf
from dfmp2.system.blas_threads import torch_owns_the_cores

MOLECULES = Path(__file__).resolve().parent.parent / "molecules"
NAMES = ("water", "ammonia", "methane", "hydrogen_fluoride", "formaldehyde", "benzene",
         "water_dimer", "ammonia_dimer", "methane_dimer", "benzene_water", "water_octamer",
         "hydroxyl", "methyl", "amino", "oxygen", "methylene")
LARGE = "water_16"
# Energies of one molecule under different options must agree this well to count as the same
# solution (an option that lands on another SCF solution is worse than a slow one).
SAME_SOLUTION = 1e-8
BUDGET = 8 * 10**9
# ADIIS steers while the DIIS error vector is larger than this, then DIIS alone (the usual
# hand-over of ADIIS+DIIS).
ADIIS_HANDOVER = 0.1
# The converged small-basis SCF whose density, projected, starts the cc-pVDZ SCF.
SMALL_BASIS_CONV_TOL = 1e-8


@dataclass(frozen=True)
class Option:
    label: str
    init_guess: str = "minao"
    ladder: bool = True
    exact_energy_change: bool = True
    diis_space: int | None = None  # the engine's own for the reference
    diis_start_cycle: int = 1
    diis: str = "cdiis"
    small_basis: str | None = None


OPTIONS = (
    Option("old default: fp64 builds, E difference, DIIS space 8", ladder=False,
           exact_energy_change=False, diis_space=8),
    Option("default: minao"),
    Option("E difference", exact_energy_change=False),
    Option("fp64 builds only", ladder=False),
    Option("atom", init_guess="atom"),
    Option("huckel", init_guess="huckel"),
    Option("mod_huckel", init_guess="mod_huckel"),
    Option("1e", init_guess="1e"),
    Option("sap", init_guess="sap"),
    Option("projected from sto-3g", small_basis="sto-3g"),
    Option("projected from 6-31g", small_basis="6-31g"),
    Option("DIIS space 8", diis_space=8),
    Option("DIIS space 16", diis_space=16),
    Option("DIIS from cycle 0", diis_start_cycle=0),
    Option("DIIS from cycle 2", diis_start_cycle=2),
    Option("EDIIS", diis="ediis"),
    Option("ADIIS", diis="adiis"),
    Option("ADIIS then DIIS", diis="adiis+cdiis"),
)


class AdiisThenCdiis(CDIIS):
    """DIIS that keeps every Fock matrix, but lets ADIIS choose the step while the error
    vector is large."""

    def __init__(self, mf=None, filename=None, Corth=None):
        super().__init__(mf, filename, Corth)
        self.adiis = ADIIS()
        self.steering = True

    def update(self, s, d, f, *args, **kwargs):
        extrapolated = super().update(s, d, f, *args, **kwargs)
        from_adiis = self.adiis.update(s, d, f, *args, **kwargs)
        error = np.linalg.norm(self.get_err_vec(self._head - 1))
        self.steering = self.steering and error > ADIIS_HANDOVER
        return from_adiis if self.steering else extrapolated


DIIS_CLASSES = {"cdiis": CDIIS, "ediis": EDIIS, "adiis": ADIIS, "adiis+cdiis": AdiisThenCdiis}


@dataclass
class Outcome:
    cycles: int
    fp32_builds: int
    fp64_builds: int
    energy: float
    converged: bool
    seconds: float
    small_cycles: int = 0


def small_basis_density(calc, basis: str) -> tuple[np.ndarray, int]:
    """The converged density of the same molecule in ``basis``, projected onto the
    calculation's basis, and the small SCF's cycles."""
    small = calc.mol.copy()
    small.basis = basis
    small.build()
    mf = (scf.UHF(small) if calc.reference == "uhf" else scf.RHF(small)).density_fit()
    mf.conv_tol, mf.verbose = SMALL_BASIS_CONV_TOL, 0
    count = [0]
    mf.callback = lambda envs: count.__setitem__(0, count[0] + 1)
    mf.kernel()
    dm = mf.make_rdm1()
    if dm.ndim == 3:
        projected = np.stack([scf.addons.project_dm_nr2nr(small, d, calc.mol) for d in dm])
    else:
        projected = scf.addons.project_dm_nr2nr(small, dm, calc.mol)
    return projected, count[0]


def run(name: str, option: Option) -> Outcome:
    calc = define_calculation(read_xyz(MOLECULES / f"{name}.xyz"), CalculationRequest())
    kernels = scf_kernels("torch", "fp64", ladder=option.ladder)
    mf = new_scf(calc, ScfOptions("kernels", kernels, BUDGET, None))
    mf.init_guess = option.init_guess
    if option.diis_space is not None:
        mf.diis_space = option.diis_space
    mf.diis_start_cycle = option.diis_start_cycle
    mf.DIIS = DIIS_CLASSES[option.diis]
    mf.with_df.ladder.exact_energy_change = option.exact_energy_change
    dm0, small_cycles = (None, 0) if option.small_basis is None else small_basis_density(
        calc, option.small_basis)
    count = [0]
    mf.callback = lambda envs: count.__setitem__(0, count[0] + 1)
    start = time.perf_counter()
    with torch_owns_the_cores():
        energy = float(mf.kernel(dm0=dm0))
    seconds = time.perf_counter() - start
    precisions = [build.precision for build in mf.with_df.engine.builds]
    mf.with_df.reset()
    return Outcome(count[0], precisions.count("fp32"), precisions.count("fp64"), energy,
                   bool(mf.converged), seconds, small_cycles)


def cell(outcome: Outcome, reference: Outcome) -> str:
    text = f"{outcome.cycles} ({outcome.fp32_builds}+{outcome.fp64_builds})"
    if outcome.small_cycles:
        text += f" +{outcome.small_cycles}s"
    if not outcome.converged:
        return text + " not converged"
    if abs(outcome.energy - reference.energy) > SAME_SOLUTION:
        return text + " other solution"
    return text


def summary(names: list[str], options: list[Option], results: dict) -> None:
    """Per option: totals over the small molecules, (H2O)16, and the largest energy
    difference from the old default."""
    small = [name for name in names if name != LARGE]
    reference = OPTIONS[0].label
    print("\n| option | cycles | builds fp32 + fp64 | (H2O)16 cycles | (H2O)16 builds "
          "| max abs(dE) vs old default | off its solution | SCF seconds |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for option in options:
        rows = [results[name][option.label] for name in small]
        large = results.get(LARGE, {}).get(option.label)
        delta = max((abs(results[name][option.label].energy - results[name][reference].energy)
                     for name in names if reference in results[name]), default=float("nan"))
        off = sum(1 for name in names if reference in results[name]
                  and (not results[name][option.label].converged
                       or abs(results[name][option.label].energy
                              - results[name][reference].energy) > SAME_SOLUTION))
        print(f"| {option.label} | {sum(r.cycles for r in rows)} | "
              f"{sum(r.fp32_builds for r in rows)} + {sum(r.fp64_builds for r in rows)} | "
              + (f"{large.cycles} | {large.fp32_builds} + {large.fp64_builds}" if large
                 else "- | -") + f" | {delta:.1e} | {off} | "
              f"{sum(results[name][option.label].seconds for name in names):.1f} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--names", default=",".join((*NAMES, LARGE)))
    parser.add_argument("--options", default=None,
                        help="comma-separated option labels (default: all)")
    parser.add_argument("--json", default=None, help="also write every outcome here")
    args = parser.parse_args()
    names = args.names.split(",")
    wanted = None if args.options is None else set(args.options.split(","))
    options = [*OPTIONS[:2], *(option for option in OPTIONS[2:]
                               if wanted is None or option.label in wanted)]
    print("| molecule | " + " | ".join(option.label for option in options) + " |")
    print("|---|" + "---:|" * len(options))
    results: dict[str, dict[str, Outcome]] = {}
    for name in names:
        results[name] = {option.label: run(name, option) for option in options}
        reference = results[name][OPTIONS[0].label]
        print(f"| {name} | " + " | ".join(cell(outcome, reference)
                                          for outcome in results[name].values()) + " |",
              flush=True)
    summary(names, options, results)
    if args.json:
        Path(args.json).write_text(json.dumps(
            {name: {label: vars(outcome) for label, outcome in row.items()}
             for name, row in results.items()}, indent=1))


if __name__ == "__main__":
    main()
