"""Projected wall time and parallel efficiency of one calculation on R ranks, from measured
single-process stage times and the bytes each collective moves.

Input: the JSON that `benchmarks/distributed_speedup.py --json FILE` writes (each case's
single-process `/timings`, the SCF's J/K build count and the basis size). Model, per stage:
the parallel stages (JK-fit tensor, J/K builds, B, energy, the gradient's sweeps) divide by R;
the replicated part (PySCF's SCF driver: guess, DIIS, diagonalisation; start-up) does not;
every J/K build broadcasts the density and sums J and K (3 N^2 doubles, ring all-reduce:
2 (R - 1) / R of the bytes per rank, plus log2 R latencies); the JK-fit tensor and B pass
once through the shared scratch file (written and read at the file bandwidth). A larger
molecule scales each stage by its power of N (tensor N^3, J/K and B N^4, energy N^5,
diagonalisation N^3, collectives N^2).

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
    """Where the ranks run: per-rank compute speed relative to one core of the measuring
    machine, collective bandwidth (bytes/s per rank) and latency, shared-file bandwidth."""

    name: str
    ranks: tuple[int, ...]
    speed: float
    link_bytes_per_s: float
    latency_s: float
    file_bytes_per_s: float


MACHINES = (
    # trn1.32xlarge: 32 NeuronCores; the ranks of one instance exchange through host memory.
    Machine("one trn1.32xlarge", (1, 2, 4, 8, 16, 32), 1.0, 10e9, 10e-6, 2e9),
    # 4 instances over EFA (800 Gbit/s per instance, shared by its 32 ranks).
    Machine("4 x trn1.32xlarge", (32, 64, 128), 1.0, 100e9 / 8 / 32 * 8, 30e-6, 1e9),
)


def stages_of(case: dict) -> dict[str, float]:
    """Single-process seconds per modelled stage, from the record's /timings and the SCF's
    J/K build seconds; what no parallel stage accounts for is replicated on every rank."""
    t = case["single_timings"]
    stages = {"jk_tensor": t.get("jk_tensor", 0.0), "jk_builds": t.get("jk_builds", 0.0),
              "b_build": sum(t.get(k, 0.0) for k in ("integrals", "transform", "fit")),
              "energy": t.get("energy", 0.0), "gradient": t.get("gradient", 0.0)}
    stages["replicated"] = max(0.0, t["total"] - sum(stages.values()))
    return stages


def projected(stages: dict[str, float], nao: int, builds: int, tensor_bytes: float,
              b_bytes: float, machine: Machine, ranks: int, scale: float) -> float:
    compute = {name: seconds * scale ** EXPONENTS[name] / machine.speed
               for name, seconds in stages.items()}
    parallel = sum(v for k, v in compute.items() if k != "replicated") / ranks
    n = nao * scale
    per_build = 3 * n * n * FP64_BYTES
    hops = 2 * (ranks - 1) / ranks if ranks > 1 else 0.0
    latency = 3 * machine.latency_s * max(1, (ranks - 1).bit_length()) if ranks > 1 else 0.0
    collectives = builds * (per_build * hops / machine.link_bytes_per_s + latency)
    files = 0.0 if ranks == 1 else 2 * (tensor_bytes * scale ** 3 + b_bytes * scale ** 4) / (
        machine.file_bytes_per_s * ranks)
    return compute["replicated"] + parallel + collectives + files


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("measured", type=Path)
    parser.add_argument("--target-nao", type=int, default=1000)
    args = parser.parse_args()
    cases = json.loads(args.measured.read_text())
    for case in cases:
        stages = stages_of(case)
        nao, builds = case["nao"], case["jk_build_count"]
        tensor_bytes, b_bytes = case["jk_tensor_bytes"], case["b_bytes"] or 0.0
        for scale, label in ((1.0, f"{case['case']}, {nao} functions"),
                             (args.target_nao / nao, f"{args.target_nao} functions")):
            print(f"\n{label}")
            print("| machine | ranks | projected s | speed-up | efficiency |")
            print("|---|---:|---:|---:|---:|")
            base = projected(stages, nao, builds, tensor_bytes, b_bytes, MACHINES[0], 1,
                             scale)
            for machine in MACHINES:
                for ranks in machine.ranks:
                    seconds = projected(stages, nao, builds, tensor_bytes, b_bytes,
                                        machine, ranks, scale)
                    print(f"| {machine.name} | {ranks} | {seconds:.1f} | {base / seconds:.1f}x "
                          f"| {base / seconds / ranks:.0%} |")


if __name__ == "__main__":
    main()
