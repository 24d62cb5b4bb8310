"""`dfmp2 bench`: PySCF's DF-MP2 and dfmp2's MP2 stage on the same SCF orbitals, back to back.

The molecule, its reference (RHF or UHF), auxiliary basis and frozen core are defined exactly
as ``dfmp2 run`` defines them (:mod:`dfmp2.calculation`, :mod:`dfmp2.scf`), so the benchmark
times the calculation a run would do.
"""
from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, replace

import numpy as np

import kernels
from dfmp2 import mp2, pipeline
from dfmp2.b_store import ScratchArea
from dfmp2.calculation import Calculation, define_calculation
from dfmp2.errors import RunFailure
from dfmp2.measure import PeakRss, energy_flops, gemm_rate
from dfmp2.memory import format_size
from dfmp2.progress import Progress
from dfmp2.pyscf_check import pyscf_dfmp2_energy
from dfmp2.record import BENCH_SCHEMA, COMPLETE, new_record, set_status, write_bench, write_record
from dfmp2.scf import run_scf
from dfmp2.settings import RunSettings
from dfmp2.xyz import read_xyz


@dataclass
class BenchRun:
    pyscf_seconds: float
    pyscf_peak_rss: int
    pyscf_e_corr: float
    dfmp2_seconds: float
    dfmp2_peak_rss: int
    dfmp2_e_corr: float
    integrals_seconds: float
    energy_seconds: float
    gemm_gflops: float
    timings: dict[str, float]

    @property
    def ratio(self) -> float:
        return self.dfmp2_seconds / self.pyscf_seconds


def bench_once(calc: Calculation, mf, kernel_set, budget: int, fused: bool,
               scratch: ScratchArea, skip_pyscf: bool) -> tuple[BenchRun, mp2.Mp2Result]:
    rate = gemm_rate(kernel_set.dtype)
    if skip_pyscf:
        reference, pyscf_peak = None, 0
    else:
        with PeakRss() as pyscf_rss:
            reference = pyscf_dfmp2_energy(mf, calc.nfrozen, calc.auxbasis.spec)
        pyscf_peak = pyscf_rss.peak
    orbitals = mp2.Orbitals(np.asarray(mf.mo_energy), np.asarray(mf.mo_coeff),
                            np.asarray(mf.mo_occ), calc.nfrozen)
    with PeakRss() as ours_rss:
        start = time.perf_counter()
        fit = mp2.fit_basis(calc.mol, calc.auxbasis)
        plan = mp2.plan_for(orbitals, fit, calc.mol.nao_nr(), kernel_set, budget, fused, None)
        result = mp2.kernel(calc.mol, orbitals, fit, kernel_set, plan,
                            mp2.Execution(scratch=scratch, show_progress=False))
        seconds = time.perf_counter() - start
    return BenchRun(reference.seconds if reference else float("nan"), pyscf_peak,
                    reference.e_corr if reference else float("nan"), seconds, ours_rss.peak,
                    result.energies.e_corr, result.timings["integrals"],
                    result.timings["energy"], rate, dict(result.timings)), result


def summarize(runs: list[BenchRun], result: mp2.Mp2Result) -> dict[str, float]:
    """Medians over the repeats; ratios are taken within each run first (the machine is shared)."""
    flops = energy_flops(list(zip(result.nocc, result.nvir)), result.naux_fit)

    def median(values) -> float:
        return float(statistics.median(values))

    limits = [r.integrals_seconds + flops / (r.gemm_gflops * 1e9) for r in runs]
    return {
        "pyscf_seconds": median(r.pyscf_seconds for r in runs),
        "dfmp2_seconds": median(r.dfmp2_seconds for r in runs),
        "ratio_to_pyscf": median(r.ratio for r in runs),
        "abs_delta_e": median(abs(r.dfmp2_e_corr - r.pyscf_e_corr) for r in runs),
        "pyscf_peak_rss_bytes": median(r.pyscf_peak_rss for r in runs),
        "dfmp2_peak_rss_bytes": median(r.dfmp2_peak_rss for r in runs),
        "gemm_gflops": median(r.gemm_gflops for r in runs),
        "energy_gflops": median(flops / r.energy_seconds / 1e9 for r in runs),
        "energy_fraction_of_gemm": median(flops / r.energy_seconds / 1e9 / r.gemm_gflops
                                          for r in runs),
        "machine_limit_seconds": median(limits),
        "ratio_to_limit": median(r.dfmp2_seconds / limit for r, limit in zip(runs, limits)),
        "energy_flops": flops,
        "integrals_seconds": median(r.integrals_seconds for r in runs),
        "energy_seconds": median(r.energy_seconds for r in runs),
        "repeats": len(runs),
    }


def targets(precision: str) -> dict[str, tuple[str, float]]:
    """The speed targets as (figure, bound); each is checked as figure <= bound, except the
    energy-step efficiency, which is a lower bound."""
    if precision == "fp32":
        return {"ratio_to_pyscf": ("<=", 0.3), "abs_delta_e": ("<=", 1e-6)}
    return {"ratio_to_pyscf": ("<=", 0.4), "abs_delta_e": ("<=", 1e-8),
            "energy_fraction_of_gemm": (">=", 0.75), "ratio_to_limit": ("<=", 1.3)}


def verdicts(summary: dict[str, float], precision: str) -> list[str]:
    lines = []
    for key, (op, bound) in targets(precision).items():
        value = summary[key]
        if value != value:
            lines.append(f"  target {key} {op} {bound:g}: not measured (PySCF was skipped)")
            continue
        met = value <= bound if op == "<=" else value >= bound
        gap = ("" if met else
               f"  (missed by {abs(value - bound):.3g}, {value / bound:.2f}x the bound)")
        lines.append(f"  target {key} {op} {bound:g}: measured {value:.4g} -> "
                     f"{'met' if met else 'MISSED'}{gap}")
    return lines


def as_arrays(runs: list[BenchRun]) -> dict[str, np.ndarray]:
    fields = ("pyscf_seconds", "dfmp2_seconds", "pyscf_peak_rss", "dfmp2_peak_rss",
              "integrals_seconds", "energy_seconds", "gemm_gflops", "pyscf_e_corr",
              "dfmp2_e_corr")
    return {name: np.array([getattr(r, name) for r in runs], dtype=float) for name in fields}


def run_bench(settings: RunSettings, repeat: int, skip_pyscf: bool) -> tuple[dict, str]:
    path = settings.output or pipeline.DEFAULT_OUTPUT_DIR / (
        f"bench-{settings.molecule.stem}-{settings.basis.lower()}-"
        f"{settings.precision or 'fp64'}.h5")
    pipeline.check_output_path(path)
    geometry = read_xyz(settings.molecule)
    settings = replace(settings, backend="torch")
    env = pipeline.resolve_environment(settings, path)
    calc = define_calculation(geometry, pipeline.request_of(settings, settings.charge,
                                                            settings.spin))
    pipeline.check_feasible(calc, settings, env)
    scf_result = run_scf(calc.mol, calc.scf_method, calc.reference, calc.jk_spec(),
                         calc.jk_name(), env.budget)
    if not scf_result.converged:
        raise RunFailure("the SCF did not converge; there is nothing to benchmark")
    kernel_set = kernels.load("torch", env.kernel_set.precision)
    scratch = ScratchArea(env.scratch_dir, f"{path.name}.bench")
    runs, result = [], None
    progress = Progress(repeat, "benchmark repeats")
    for _ in range(repeat):
        run, result = bench_once(calc, scf_result.mf, kernel_set, env.budget,
                                 settings.fused_energy, scratch, skip_pyscf)
        runs.append(run)
        progress.advance()
    summary = summarize(runs, result)
    summary.update({"molecule": str(settings.molecule), "basis": settings.basis,
                    "reference": calc.reference, "precision": kernel_set.precision,
                    "threads": env.threads, "nao": result.nao, "nocc": result.nocc[0],
                    "nvir": result.nvir[0], "naux": result.naux_fit,
                    "out_of_core": result.plan.out_of_core, "record": str(path)})
    root = new_record(BENCH_SCHEMA, settings.command, pipeline.versions())
    set_status(root, COMPLETE)
    write_bench(root, summary, as_arrays(runs), [r.timings for r in runs])
    write_record(path, root)
    return summary, format_table(summary, runs, kernel_set.precision)


def format_table(summary: dict, runs: list[BenchRun], precision: str) -> str:
    lines = [f"{summary['molecule']} / {summary['basis']} ({summary['reference'].upper()}, "
             f"{precision}, {summary['threads']} threads): nao {summary['nao']} nocc "
             f"{summary['nocc']} nvir {summary['nvir']} naux {summary['naux']}",
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
        *verdicts(summary, precision),
        f"record: {s['record']}",
    ]
    return "\n".join(lines)
