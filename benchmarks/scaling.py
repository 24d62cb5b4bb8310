"""Whole-calculation time against cluster size: PySCF (DF-RHF + DFMP2) and `dfmp2 run` on
(H2O)n / cc-pVDZ.

The clusters are the first n molecules of molecules/water_16.xyz (O, H, H per molecule), so
every size is a piece of one real cluster. For each n, `dfmp2 bench`'s measurement: PySCF's
density-fitted RHF (same JK-fit basis and thresholds) plus its DFMP2 (same RI basis,
with_t2=False), and dfmp2's whole run, each in a fresh process. Prints a Markdown table with
the fitted power-law exponent of each curve and writes a PNG.

    python benchmarks/scaling.py --sizes 1,2,4,6,8,10,12,14,16 --png docs/scaling.png \
        --json docs/scaling.json
    python benchmarks/scaling.py --from-json docs/scaling.json --png docs/scaling.png  # re-plot
"""
from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

import numpy as np

from dfmp2.jobs.bench import bench_once
from dfmp2.input.settings import RunSettings

CLUSTER = Path(__file__).resolve().parent.parent / "molecules" / "water_16.xyz"
# Sizes below this are dominated by fixed overheads; the exponent is fitted above it.
FIT_FROM = 4


def cluster_xyz(n: int) -> str:
    lines = CLUSTER.read_text().splitlines()
    atoms = lines[2:2 + 3 * n]
    return f"{len(atoms)}\n(H2O){n}: first {n} molecules of {CLUSTER.name}\n" + "\n".join(atoms)


def time_size(n: int, basis: str, threads: int | None) -> dict:
    with tempfile.TemporaryDirectory() as folder:
        xyz = Path(folder) / f"water_{n}.xyz"
        xyz.write_text(cluster_xyz(n) + "\n")
        run = bench_once(RunSettings(molecule=xyz, basis=basis, threads=threads,
                                     show_progress=False), skip_pyscf=False)
    ours, theirs = run["dfmp2"], run["pyscf"]
    return {"n": n, "nao": ours["sizes"][0], "pyscf": theirs["total_seconds"],
            "pyscf_scf": theirs["scf_seconds"], "dfmp2": ours["total_seconds"],
            "dfmp2_scf": ours["scf_seconds"],
            "delta": abs(ours["e_scf"] + ours["e_corr"] - theirs["e_scf"] - theirs["e_corr"])}


def exponent(rows: list[dict], key: str) -> float:
    fit = [r for r in rows if r["n"] >= FIT_FROM]
    return float(np.polyfit(np.log([r["n"] for r in fit]), np.log([r[key] for r in fit]), 1)[0])


def markdown(rows: list[dict]) -> str:
    lines = ["| n | nao | PySCF SCF+MP2 / s | of which SCF | dfmp2 run / s | of which SCF | "
             "ratio | abs(dE_tot) / Eh |",
             "|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['n']} | {r['nao']} | {r['pyscf']:.2f} | {r['pyscf_scf']:.2f} | "
                     f"{r['dfmp2']:.2f} | {r['dfmp2_scf']:.2f} | {r['dfmp2'] / r['pyscf']:.2f} "
                     f"| {r['delta']:.1e} |")
    lines.append(f"\nFitted exponents (n >= {FIT_FROM}): PySCF {exponent(rows, 'pyscf'):.2f}, "
                 f"dfmp2 {exponent(rows, 'dfmp2'):.2f}")
    return "\n".join(lines)


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    n = [r["n"] for r in rows]
    fig, ax = plt.subplots(figsize=(6, 4.2))
    for key, label in (("pyscf", "PySCF DF-RHF + DFMP2"), ("dfmp2", "dfmp2 run (torch fp64)")):
        ax.loglog(n, [r[key] for r in rows], "o-",
                  label=f"{label}, fitted n^{exponent(rows, key):.2f}")
    ax.set_xlabel("water molecules n in (H2O)n, cc-pVDZ")
    ax.set_ylabel("whole calculation (SCF + MP2) wall time / s")
    ax.set_title("DF-MP2 stage on 2 CPU cores (same SCF orbitals)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1,2,4,6,8,10,12,14,16")
    parser.add_argument("--basis", default="cc-pvdz")
    parser.add_argument("--png", type=Path, default=None)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--json", type=Path, default=None, help="Save the measurements here.")
    parser.add_argument("--from-json", type=Path, default=None,
                        help="Re-plot saved measurements instead of measuring.")
    args = parser.parse_args()
    if args.from_json:
        rows = json.loads(args.from_json.read_text())
    else:
        rows = [time_size(int(n), args.basis, args.threads) for n in args.sizes.split(",")]
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1) + "\n")
    print(markdown(rows))
    if args.png:
        plot(rows, args.png)
        print(f"\nplot: {args.png}")


if __name__ == "__main__":
    main()
