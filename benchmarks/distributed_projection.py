"""Projected wall time and parallel efficiency of one calculation on R ranks, from measured
stage times on 1 and 2 ranks and the bytes each collective moves.

Input: the JSON that `benchmarks/distributed_speedup.py --json FILE` writes (each case's
single-process and 2-rank `/timings`, the SCF's J/K build count and the basis size). Model,
per stage (JK-fit tensor, J/K builds, B, energy, gradient, and the rest: PySCF's SCF driver,
metric, start-up inside the record): the share p that divided over the 2 ranks is read off
the measurement (T2 = T1 (1 - p) + T1 p / 2), and on R ranks the stage takes
T1 (1 - p) + T1 p / R, so what did not divide here (replicated work, the shared-file round
trips) is carried as it was measured. On top, every J/K build broadcasts the density and
sums J and K (3 N^2 doubles; a ring all-reduce moves 2 (R - 1) / R of them per rank, plus
log2 R latencies) at the link bandwidth of the machine. A larger molecule scales each stage
by its power of N (tensor N^3, J/K and B N^4, energy and gradient N^5, the rest N^3,
collectives N^2). Compute is in units of one core of the measuring machine; a faster rank
(`--speed`) shortens compute but not the collectives.

    python benchmarks/distributed_projection.py docs/distributed_speedup.json
"""
from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from pathlib import Path

FP64_BYTES = 8
EXPONENTS = {"jk_tensor": 3, "jk_builds": 4, "b_build": 4, "energy": 5, "gradient": 5,
             "replicated": 3}


@dataclass(frozen=True)
class Machine:
    """Where the ranks run: how many, and the collective bandwidth (bytes/s per rank) and
    latency between them."""

    name: str
    ranks: tuple[int, ...]
    link_bytes_per_s: float
    latency_s: float


MACHINES = (
    # trn1.32xlarge: 32 NeuronCores (16 chips); the ranks of one instance exchange through
    # host memory, assumed 10 GB/s per rank and 10 us per message.
    Machine("one trn1.32xlarge", (1, 2, 4, 8, 16, 32), 10e9, 10e-6),
    # 4 instances over EFA: 800 Gbit/s (100 GB/s) per instance shared by its 32 ranks,
    # about 3 GB/s per rank, 30 us per message.
    Machine("4 x trn1.32xlarge", (32, 64, 128), 100e9 / 32, 30e-6),
)


def stage_seconds(timings: dict[str, float]) -> dict[str, float]:
    """Seconds per modelled stage from a record's /timings (plus the J/K build seconds)."""
    stages = {"jk_tensor": timings.get("jk_tensor", 0.0),
              "jk_builds": timings.get("jk_builds", 0.0),
              "b_build": sum(timings.get(k, 0.0) for k in ("integrals", "transform", "fit")),
              "energy": timings.get("energy", 0.0), "gradient": timings.get("gradient", 0.0)}
    stages["replicated"] = max(0.0, timings["total"] - sum(stages.values()))
    return stages


def divided_shares(case: dict) -> dict[str, tuple[float, float]]:
    """(single-process seconds, share p that divided over 2 ranks) per stage."""
    one, two = stage_seconds(case["single_timings"]), stage_seconds(case["rank_timings"])
    return {name: (t1, min(1.0, max(0.0, 2.0 * (1.0 - two[name] / t1))) if t1 > 0 else 1.0)
            for name, t1 in one.items()}


def projected(shares: dict[str, tuple[float, float]], nao: int, builds: int,
              machine: Machine, ranks: int, scale: float, speed: float) -> float:
    compute = 0.0
    for name, (t1, p) in shares.items():
        seconds = t1 * scale ** EXPONENTS[name] / speed
        compute += seconds * (1.0 - p) + seconds * p / ranks
    n = nao * scale
    hops = 2 * (ranks - 1) / ranks if ranks > 1 else 0.0
    latency = 3 * machine.latency_s * max(1, (ranks - 1).bit_length()) if ranks > 1 else 0.0
    collectives = builds * (3 * n * n * FP64_BYTES * hops / machine.link_bytes_per_s
                            + latency)
    return compute + collectives


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("measured", type=Path)
    parser.add_argument("--target-nao", type=int, default=1000)
    parser.add_argument("--speed", type=float, default=1.0,
                        help="a rank's compute speed relative to one measuring core")
    args = parser.parse_args()
    for case in json.loads(args.measured.read_text()):
        shares = divided_shares(case)
        nao, builds = case["nao"], case["jk_build_count"]
        print(f"\n{case['case']}: share divided over 2 ranks, measured: "
              + ", ".join(f"{name} {p:.0%} of {t1:.1f} s" for name, (t1, p) in shares.items()
                          if t1 > 0))
        for scale, label in ((1.0, f"{case['case']}, {nao} functions"),
                             (args.target_nao / nao, f"{args.target_nao} functions")):
            print(f"\n{label}")
            print("| machine | ranks | projected s | speed-up | efficiency |")
            print("|---|---:|---:|---:|---:|")
            base = projected(shares, nao, builds, MACHINES[0], 1, scale, args.speed)
            for machine in MACHINES:
                for ranks in machine.ranks:
                    seconds = projected(shares, nao, builds, machine, ranks, scale,
                                        args.speed)
                    print(f"| {machine.name} | {ranks} | {seconds:.1f} | "
                          f"{base / seconds:.1f}x | {base / seconds / ranks:.0%} |")


if __name__ == "__main__":
    main()
