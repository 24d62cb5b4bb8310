"""One calculation on one process against the same calculation on R torchrun ranks (gloo), each
process on one thread, as issue "every worker busy" measures it.

For each case the single process and the R-rank job run alternately (`--repeat` pairs), in
fresh processes with OMP_NUM_THREADS=1 and `--threads 1`; the whole command's wall time is
taken around the process, the stage times come from the run records (`/timings`, and
`/distributed` for each rank's stages and peak memory). Prints a Markdown table: median wall
times, the speed-up (single / ranks, pair by pair, then the median), the largest energy or
gradient difference, and each rank's peak memory against the single process.

    python benchmarks/distributed_speedup.py --ranks 2 --repeat 3
    python benchmarks/distributed_speedup.py --case run:16 --case gradient:8 --ranks 2
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import h5py
import numpy as np

CLUSTER = Path(__file__).resolve().parent.parent / "molecules" / "water_16.xyz"
DEFAULT_CASES = ("run:16", "gradient:8")


def cluster_xyz(n: int) -> str:
    lines = CLUSTER.read_text().splitlines()
    atoms = lines[2:2 + 3 * n]
    return f"{len(atoms)}\n(H2O){n}: first {n} molecules of {CLUSTER.name}\n" + "\n".join(atoms)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def command(kind: str, xyz: Path, record: Path, ranks: int) -> list[str]:
    args = ["-m", "dfmp2", kind, str(xyz), "--basis", "cc-pvdz", "--threads", "1",
            "--backend", "torch", "-o", str(record)]
    if ranks == 1:
        return [sys.executable, *args]
    return [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(ranks),
            "--master-addr", "127.0.0.1", "--master-port", str(free_port()), *args]


def timed(argv: list[str]) -> tuple[float, float]:
    """Wall seconds of the command, and the peak resident memory (MB) of its largest
    process as GNU time reports it."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    start = time.perf_counter()
    done = subprocess.run(["/usr/bin/time", "-f", "peak_kb=%M", *argv], capture_output=True,
                          text=True, env=env)
    seconds = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} failed:\n{done.stderr[-2000:]}")
    peak = [line for line in done.stderr.splitlines() if line.startswith("peak_kb=")]
    return seconds, float(peak[-1].split("=")[1]) / 1e3 if peak else float("nan")


def read_result(record: Path, kind: str) -> dict:
    with h5py.File(record, "r") as h5:
        result = {"timings": {k: float(v) for k, v in h5["timings"].attrs.items()},
                  "e_tot": float(h5["mp2"].attrs["e_tot"]),
                  "nao": int(h5["scf"]["mo_coeff"].shape[-2])}
        if "scf_engine" in h5:
            engine = h5["scf_engine"].attrs
            result["jk_build_count"] = int(engine["builds"])
            result["timings"]["jk_builds"] = float(np.sum(json.loads(engine["build_seconds"])))
            result["jk_tensor_bytes"] = float(engine["tensor_bytes"])
        if "plan" in h5:
            result["b_bytes"] = float(h5["plan"].attrs["b_bytes"])
        if kind == "gradient":
            result["gradient"] = np.asarray(h5["gradient"]["gradient"])
        if "distributed" in h5:
            result["distributed"] = {key: h5["distributed"].attrs[key]
                                     for key in h5["distributed"].attrs}
    return result


def peak_megabytes(result: dict) -> list[float]:
    """Each rank's peak resident memory, as the record's /distributed holds it."""
    dist = result.get("distributed", {})
    return [float(value) for key, value in sorted(dist.items())
            if key.endswith(".peak_rss_mb")]


def measure(case: str, ranks: int, repeat: int, folder: Path) -> dict:
    kind, size = case.split(":")
    xyz = folder / f"water_{size}.xyz"
    xyz.write_text(cluster_xyz(int(size)) + "\n")
    walls: dict[int, list[float]] = {1: [], ranks: []}
    results: dict[int, dict] = {}
    for n in range(repeat):
        for world in (1, ranks):
            record = folder / f"{kind}-{size}-{world}-{n}.h5"
            seconds, peak = timed(command(kind, xyz, record, world))
            walls[world].append(seconds)
            results[world] = {**read_result(record, kind), "peak_mb": peak}
    one, many = results[1], results[ranks]
    delta = abs(one["e_tot"] - many["e_tot"])
    if kind == "gradient":
        delta = max(delta, float(np.abs(one["gradient"] - many["gradient"]).max()))
    ratios = [a / b for a, b in zip(walls[1], walls[ranks])]
    return {"case": f"{kind} (H2O){size}", "single": statistics.median(walls[1]),
            "ranks": statistics.median(walls[ranks]), "speedup": statistics.median(ratios),
            "speedups": ratios, "delta": delta, "single_timings": one["timings"],
            "rank_timings": many["timings"], "rank_peaks_mb": peak_megabytes(many),
            "single_peak_mb": one.get("peak_mb"), "nao": one["nao"],
            "jk_build_count": one.get("jk_build_count"),
            "jk_tensor_bytes": one.get("jk_tensor_bytes"), "b_bytes": one.get("b_bytes"),
            "distributed": {k: str(v) for k, v in many.get("distributed", {}).items()}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--case", action="append", help="run:N or gradient:N ((H2O)N)")
    parser.add_argument("--json", type=Path, help="also write every figure here")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        rows = [measure(case, args.ranks, args.repeat, Path(folder))
                for case in args.case or DEFAULT_CASES]
    print(f"| case | 1 process / s | {args.ranks} ranks / s | speed-up (median of pairs) | "
          "max abs difference | peak memory 1 process / MB | each rank / MB |")
    print("|---|---:|---:|---:|---:|---:|---|")
    for row in rows:
        peaks = ", ".join(f"{p:.0f}" for p in row["rank_peaks_mb"]) or "-"
        print(f"| {row['case']} | {row['single']:.1f} | {row['ranks']:.1f} | "
              f"{row['speedup']:.2f}x | {row['delta']:.1e} | {row['single_peak_mb']:.0f} | "
              f"{peaks} |")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1, default=float) + "\n")


if __name__ == "__main__":
    main()
