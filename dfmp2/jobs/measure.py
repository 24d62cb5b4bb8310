"""Measuring instruments for benchmarks: peak resident memory, this machine's dgemm rate now,
and the flops of the energy step."""
from __future__ import annotations

import threading
import time

import torch

PAGE_BYTES = 4096
RSS_SAMPLE_SECONDS = 0.01
GEMM_SIZE = 2048
GEMM_REPEATS = 3


def rss_bytes() -> int:
    with open("/proc/self/statm", encoding="ascii") as statm:
        return int(statm.read().split()[1]) * PAGE_BYTES


class PeakRss:
    """Samples this process's resident set size in a thread while the block runs."""

    def __enter__(self) -> "PeakRss":
        self.peak = rss_bytes()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def _sample(self) -> None:
        while not self._stop.wait(RSS_SAMPLE_SECONDS):
            self.peak = max(self.peak, rss_bytes())

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, rss_bytes())


def gemm_rate(dtype: torch.dtype) -> float:
    """Best-of-N GFLOP/s of one square torch matmul on this machine, now."""
    a = torch.randn(GEMM_SIZE, GEMM_SIZE, dtype=dtype)
    b = torch.randn(GEMM_SIZE, GEMM_SIZE, dtype=dtype)
    a @ b
    best = float("inf")
    for _ in range(GEMM_REPEATS):
        start = time.perf_counter()
        a @ b
        best = min(best, time.perf_counter() - start)
    return 2 * GEMM_SIZE**3 / best / 1e9


def energy_flops(sizes: list[tuple[int, int]], naux: int) -> float:
    """Flops of the energy step's pair contractions: 2 naux per (ia|jb) element formed, over
    occupied pairs I <= J of each same-spin channel and every alpha-beta pair for UHF."""
    flops = sum(nocc * (nocc + 1) * nvir * nvir * naux for nocc, nvir in sizes)
    if len(sizes) == 2:
        (nocc_a, nvir_a), (nocc_b, nvir_b) = sizes
        flops += 2 * nocc_a * nocc_b * nvir_a * nvir_b * naux
    return float(flops)
