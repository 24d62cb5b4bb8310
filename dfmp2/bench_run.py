"""The `dfmp2 bench` job: SCF once, timed repeats, a printed table and a benchmark record."""
from __future__ import annotations

import datetime as dt
import sys
from pathlib import Path

from dfmp2 import bench, mp2
from dfmp2.job import DEFAULT_OUTPUT_DIR, apply_threads, check_output_path, versions
from dfmp2.memory import default_budget, format_size
from dfmp2.molecule import build_molecule, read_xyz, resolve_charge_spin
from dfmp2.progress import Progress
from dfmp2.record import BENCH_SCHEMA, Node, write_record
from dfmp2.scf import run_scf


def run_bench(molecule: Path, basis: str, auxbasis: str | None, precision: str,
              frozen_core: bool, fused: bool, memory: int | None, repeat: int,
              threads: int | None, skip_pyscf: bool,
              output: Path | None) -> tuple[dict, str]:
    path = output or DEFAULT_OUTPUT_DIR / f"bench-{molecule.stem}-{basis.lower()}-{precision}.h5"
    check_output_path(path)
    geometry = read_xyz(molecule)
    charge, spin = resolve_charge_spin(geometry, None, None)
    mol = build_molecule(geometry, basis, charge, spin)
    auxbasis = auxbasis or mp2.default_auxbasis(mol)
    nfrozen = mp2.frozen_core_count(mol) if frozen_core else 0
    nthreads = apply_threads(threads)
    budget = memory or default_budget()
    scf_result = run_scf(mol)
    runs, result = [], None
    progress = Progress(repeat, "benchmark repeats")
    for _ in range(repeat):
        run, result = bench.bench_once(scf_result.mf, nfrozen, auxbasis, precision, budget, fused,
                                       path.parent, skip_pyscf)
        runs.append(run)
        progress.advance()
    summary = bench.summarize(runs, result)
    summary.update({"molecule": str(molecule), "basis": basis, "precision": precision,
                    "threads": nthreads, "nao": result.nao, "nocc": result.nocc[0],
                    "nvir": result.nvir[0], "naux": result.naux_fit,
                    "out_of_core": result.plan.out_of_core, "record": str(path)})

    root = Node(attrs={"schema": BENCH_SCHEMA, "status": "complete",
                       "created": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
                       "command": " ".join(["dfmp2", *sys.argv[1:]])})
    root.group("bench").attrs.update(summary)
    root.group("runs").datasets.update(bench.as_arrays(runs))
    root.group("runs").attrs["stage_timings"] = [r.timings for r in runs]
    root.group("versions").attrs.update(versions())
    write_record(path, root)
    return summary, format_table(summary, runs, precision)


def format_table(summary: dict, runs: list[bench.BenchRun], precision: str) -> str:
    lines = [f"{summary['molecule']} / {summary['basis']} ({precision}, {summary['threads']} "
             f"threads): nao {summary['nao']} nocc {summary['nocc']} nvir {summary['nvir']} "
             f"naux {summary['naux']}",
             f"{'run':>4} {'PySCF s':>9} {'dfmp2 s':>9} {'ratio':>7} {'|dE| Eh':>9} "
             f"{'ints s':>7} {'energy s':>9} {'dgemm GF':>9}"]
    for n, r in enumerate(runs, start=1):
        lines.append(f"{n:>4} {r.pyscf_seconds:9.2f} {r.dfmp2_seconds:9.2f} {r.ratio:7.3f} "
                     f"{abs(r.dfmp2_e_corr - r.pyscf_e_corr):9.1e} {r.integrals_seconds:7.2f} "
                     f"{r.energy_seconds:9.2f} {r.gemm_gflops:9.1f}")
    s = summary
    lines += [
        f"median: PySCF {s['pyscf_seconds']:.2f} s, dfmp2 {s['dfmp2_seconds']:.2f} s, "
        f"ratio {s['ratio_to_pyscf']:.3f}, |dE| {s['abs_delta_e']:.1e} Eh",
        f"peak RSS: PySCF {format_size(s['pyscf_peak_rss_bytes'])}, "
        f"dfmp2 {format_size(s['dfmp2_peak_rss_bytes'])}",
        f"energy step: {s['energy_gflops']:.1f} GFLOP/s on I<=J flops "
        f"= {100 * s['energy_fraction_of_gemm']:.0f}% of the dgemm rate "
        f"{s['gemm_gflops']:.1f} GFLOP/s measured in the same run",
        f"machine limit (integrals + energy flops at the dgemm rate): "
        f"{s['machine_limit_seconds']:.2f} s; dfmp2 at {s['ratio_to_limit']:.2f}x the limit",
        *bench.verdicts(summary, precision),
        f"record: {s['record']}",
    ]
    return "\n".join(lines)
