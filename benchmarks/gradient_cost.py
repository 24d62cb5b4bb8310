"""The cost of one analytic DF-MP2 gradient against one energy and a finite-difference gradient.

Runs `dfmp2 run` (SCF + MP2) and `dfmp2 gradient` on the same molecule, each in a fresh
process, and reports their wall times (medians over repeats) and ratio. A central
finite-difference gradient needs 6 N energies (N atoms); its cost is estimated as 6 N times
the measured energy, which favours finite differences (their displaced SCFs could restart from
a nearby density, which the estimate ignores, but they also need 1e-10 Eh energies).

    python benchmarks/gradient_cost.py molecules/water_octamer.xyz --repeat 3
"""
from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def timed(*args: str) -> float:
    start = time.perf_counter()
    subprocess.run([sys.executable, "-m", "dfmp2", *args], check=True, capture_output=True)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("molecule", type=Path)
    parser.add_argument("--basis", default="cc-pvdz")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    natoms = int(args.molecule.read_text().split()[0])
    energies, gradients = [], []
    with tempfile.TemporaryDirectory() as folder:
        for n in range(args.repeat):
            energies.append(timed("run", str(args.molecule), "--basis", args.basis,
                                  "-o", f"{folder}/e{n}.h5"))
            gradients.append(timed("gradient", str(args.molecule), "--basis", args.basis,
                                   "-o", f"{folder}/g{n}.h5"))
            print(f"energy {energies[-1]:.2f} s, gradient {gradients[-1]:.2f} s", flush=True)
    energy, gradient = statistics.median(energies), statistics.median(gradients)
    finite = 6 * natoms * energy
    print(f"{args.molecule.name} / {args.basis}, {natoms} atoms, median of {args.repeat} "
          f"(whole commands, start-up included): energy {energy:.2f} s, gradient "
          f"{gradient:.2f} s = {gradient / energy:.2f}x an energy (target <= 4x: "
          f"{'met' if gradient / energy <= 4 else 'MISSED'}); central finite differences "
          f"~{finite:.0f} s = {finite / gradient:.0f}x the analytic gradient (target >= 5x: "
          f"{'met' if finite / gradient >= 5 else 'MISSED'})")


if __name__ == "__main__":
    main()
