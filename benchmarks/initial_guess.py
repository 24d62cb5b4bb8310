"""SCF cycles from each of PySCF's initial guesses on the bundled molecules (cc-pVDZ).

Every SCF is dfmp2's own (RHF or UHF, the JK-fit basis, J/K from our engine, 1e-12 Eh and a
1e-7 orbital gradient); only ``init_guess`` changes. Prints a Markdown table of cycles (and
whether each converged to the same energy as the default guess) and the totals per guess.

    python benchmarks/initial_guess.py
"""
from __future__ import annotations

import argparse
import time
from pathlib import Path

from dfmp2.input.calculation import CalculationRequest, define_calculation
from dfmp2.scf.reference import ScfOptions, new_scf
from dfmp2.scf.engine import scf_kernels
from dfmp2.input.xyz import read_xyz

MOLECULES = Path(__file__).resolve().parent.parent / "molecules"
NAMES = ("water", "ammonia", "methane", "hydrogen_fluoride", "formaldehyde", "benzene",
         "water_dimer", "ammonia_dimer", "methane_dimer", "benzene_water", "water_octamer",
         "hydroxyl", "methyl", "amino", "oxygen", "methylene")
GUESSES = ("minao", "atom", "huckel", "1e", "sap")
# Energies of one molecule from different guesses must agree this well to count as the same
# solution (a guess that lands on another SCF solution is worse than a slow one).
SAME_SOLUTION = 1e-8
BUDGET = 8 * 10**9


def cycles(name: str, guess: str) -> tuple[int, float, bool, float]:
    calc = define_calculation(read_xyz(MOLECULES / f"{name}.xyz"), CalculationRequest())
    mf = new_scf(calc, ScfOptions("kernels", scf_kernels("torch", "fp64"), BUDGET, None))
    mf.init_guess = guess
    count = [0]
    mf.callback = lambda envs: count.__setitem__(0, count[0] + 1)
    start = time.perf_counter()
    energy = mf.kernel()
    return count[0], float(energy), bool(mf.converged), time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--names", default=",".join(NAMES))
    args = parser.parse_args()
    names = args.names.split(",")
    print("| molecule | " + " | ".join(GUESSES) + " |")
    print("|---|" + "---:|" * len(GUESSES))
    totals = {guess: [0, 0.0, 0] for guess in GUESSES}
    for name in names:
        results = {guess: cycles(name, guess) for guess in GUESSES}
        reference = results["minao"][1]
        cells = []
        for guess, (count, energy, converged, seconds) in results.items():
            same = converged and abs(energy - reference) <= SAME_SOLUTION
            cells.append(f"{count}" + ("" if same else " (other solution)" if converged
                                       else " (not converged)"))
            totals[guess][0] += count
            totals[guess][1] += seconds
            totals[guess][2] += 0 if same else 1
        print(f"| {name} | " + " | ".join(cells) + " |", flush=True)
    print("| **total cycles** | " + " | ".join(str(t[0]) for t in totals.values()) + " |")
    print("| SCF seconds | " + " | ".join(f"{t[1]:.1f}" for t in totals.values()) + " |")
    print("| off the minao solution | " + " | ".join(str(t[2]) for t in totals.values()) + " |")


if __name__ == "__main__":
    main()
