"""A batch of bundled closed-shell molecules: `dfmp2 batch` against a plain PySCF loop.

Both do the same work per molecule: a density-fitted RHF (the JK-fit partner of the basis,
converged to 1e-12 Eh / 1e-7) and DF-MP2 with the RI partner (PySCF: DFMP2 with
with_t2=False). Each side runs in its own fresh Python process and is timed from inside it,
so start-up (imports) is excluded on both sides; the ratio is dfmp2 / PySCF, the median over
repeats, with the energies compared molecule by molecule.

    python benchmarks/batch_speed.py --repeat 3
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

MOLECULES = Path(__file__).resolve().parent.parent / "molecules"
# The nine small and medium closed-shell molecules of molecules/ (monomers and S22 dimers);
# the water clusters are benchmarked on their own by `dfmp2 bench`.
NAMES = ("water", "ammonia", "methane", "hydrogen_fluoride", "formaldehyde", "benzene",
         "water_dimer", "ammonia_dimer", "methane_dimer")

PYSCF_LOOP = """
import json, sys, time
from pyscf import df, gto, scf
from pyscf.mp import dfmp2
paths, basis = json.loads(sys.argv[1]), sys.argv[2]
start = time.perf_counter()
energies = {}
for path in paths:
    lines = open(path).read().splitlines()
    mol = gto.M(atom="\\n".join(lines[2:2 + int(lines[0])]), basis=basis, verbose=0)
    mf = scf.RHF(mol).density_fit(auxbasis=df.make_auxbasis(mol))
    mf.conv_tol, mf.conv_tol_grad = 1e-12, 1e-7
    mf.kernel()
    pt = dfmp2.DFMP2(mf)
    pt.with_df = df.DF(mol, auxbasis=df.make_auxbasis(mol, mp2fit=True))
    pt.kernel(with_t2=False)
    energies[path] = mf.e_tot + pt.e_corr
print(json.dumps({"seconds": time.perf_counter() - start, "energies": energies}))
"""

DFMP2_BATCH = """
import json, sys, time
from dfmp2.cli import main
paths, basis, out = json.loads(sys.argv[1]), sys.argv[2], sys.argv[3]
start = time.perf_counter()
try:
    main(["batch", *paths, "--basis", basis, "--out", out, "--json"])
except SystemExit as exc:
    if exc.code:
        raise
"""


def run_side(code: str, *args: str) -> str:
    result = subprocess.run([sys.executable, "-c", code, *args], capture_output=True,
                            text=True, check=True)
    return result.stdout


def dfmp2_side(paths: list[str], basis: str) -> tuple[float, dict]:
    with tempfile.TemporaryDirectory() as out:
        timed = DFMP2_BATCH + "\nprint('SECONDS', time.perf_counter() - start)\n"
        stdout = run_side(timed, json.dumps(paths), basis, out)
    rows_line, seconds_line = stdout.strip().splitlines()[-2:]
    rows = json.loads(rows_line)
    return float(seconds_line.split()[1]), {r["molecule"]: r["e_tot"] for r in rows}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--basis", default="cc-pvdz")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    paths = [str(MOLECULES / f"{name}.xyz") for name in NAMES]
    ratios, ours_times, theirs_times, worst = [], [], [], 0.0
    for _ in range(args.repeat):
        ours, our_energies = dfmp2_side(paths, args.basis)
        theirs = json.loads(run_side(PYSCF_LOOP, json.dumps(paths), args.basis))
        worst = max(worst, max(abs(our_energies[p] - theirs["energies"][p]) for p in paths))
        ours_times.append(ours)
        theirs_times.append(theirs["seconds"])
        ratios.append(ours / theirs["seconds"])
        print(f"dfmp2 batch {ours:.2f} s, PySCF loop {theirs['seconds']:.2f} s, "
              f"ratio {ratios[-1]:.3f}", flush=True)
    ratio = statistics.median(ratios)
    print(f"{len(paths)} molecules / {args.basis}, median of {args.repeat}: dfmp2 "
          f"{statistics.median(ours_times):.2f} s, PySCF {statistics.median(theirs_times):.2f} s, "
          f"ratio {ratio:.3f} (speed-up {1 / ratio:.2f}x; target >= 1.5x: "
          f"{'met' if 1 / ratio >= 1.5 else 'MISSED'}); max |dE_tot| {worst:.1e} Eh")


if __name__ == "__main__":
    main()
