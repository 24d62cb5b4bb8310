"""The kernel set on PyTorch (:class:`TorchKernels`), in fp64 or fp32, on any torch device.

It satisfies :class:`kernels.interface.KernelSet`; operand layouts are documented there."""
from __future__ import annotations

import math
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager

import torch

from kernels.accounting import KernelAccounting

DTYPES = {"fp64": torch.float64, "fp32": torch.float32}
# Row stripes of at least this many rows keep each GEMM of syrk and of the fused energy
# large enough to run near the BLAS peak.
MIN_STRIPE_ROWS = 512


@contextmanager
def single_threaded_ops():
    """Run small elementwise ops on one intra-op thread. Tiles of ~1e5 elements gain nothing
    from OpenMP, and when another process holds a core its barrier spin-waits made them 100x
    slower here (measured under load on 2 cores)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def resolve_device(device: str | None) -> torch.device:
    """``None`` means CUDA when present, else the CPU."""
    if device is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


def _stripe(row_unit: int, rows: int | None = None) -> int:
    """Rows per stripe: a whole number of ``row_unit``-row units, at least MIN_STRIPE_ROWS, or
    a quarter of a shorter matrix (its products keep the full contraction length, so they stay
    near the BLAS peak, and the triangle saves work: measured best for K = G G^T)."""
    target = MIN_STRIPE_ROWS if rows is None else min(MIN_STRIPE_ROWS, -(-rows // 4))
    return row_unit * max(1, -(-target // row_unit))


class ReductionBuffers:
    """Two scratch tiles reused across pairs: fresh ~1 MB tensors per pair cost page faults."""

    def __init__(self, nvir_i: int, nvir_j: int, dtype: torch.dtype, device: torch.device):
        self.denom = torch.empty((nvir_i, nvir_j), dtype=dtype, device=device)
        self.product = torch.empty((nvir_i, nvir_j), dtype=dtype, device=device)


def orbital_row_sums(t_row: torch.Tensor, denom_a: torch.Tensor, denom_col: torch.Tensor,
                     with_exchange: bool = True,
                     buffers: ReductionBuffers | None = None) -> tuple[float, float]:
    """(direct, exchange) fp64 sums for one occupied orbital i against a set of orbitals j.

    ``t_row`` is (nvir_i, nj, nvir_j) holding (ia|jb) as [a, j, b]; ``denom_a`` is e_i - e_a
    and ``denom_col`` is e_j - e_b (nj, nvir_j). Without exchange (opposite spins, where the
    virtual spaces differ) only the direct sum is formed. Each (i, j) tile of nvir_i x nvir_j
    numbers stays in cache through its few passes.
    """
    nvir_i, nj, nvir_j = t_row.shape
    buffers = buffers or ReductionBuffers(nvir_i, nvir_j, t_row.dtype, t_row.device)
    direct = exchange = 0.0
    for j in range(nj):
        tile = t_row[:, j]
        scaled = torch.add(denom_a[:, None], denom_col[j][None, :], out=buffers.denom)
        torch.div(tile, scaled, out=scaled)
        if with_exchange:
            exchange += float(torch.sum(torch.mul(scaled, tile.T, out=buffers.product),
                                        dtype=torch.float64))
        direct += float(torch.sum(scaled.mul_(tile), dtype=torch.float64))
    return direct, exchange


def pair_block_sums(t: torch.Tensor, denom_row: torch.Tensor, denom_col: torch.Tensor,
                    diagonal_block: bool, row_offset: int = 0, with_exchange: bool = True,
                    workers: int = 1) -> tuple[float, float]:
    """(direct, exchange) over a block viewed as t[i, a, j, b] (rows i, cols j).

    ``row_offset`` is the index of t's first row orbital among the column orbitals, used with
    ``diagonal_block`` to keep only pairs i >= j (i > j weighted twice). Rows are shared out to
    ``workers`` threads (each running single-threaded torch ops); the partial sums are added in
    a fixed order, so the result does not depend on timing.
    """
    def rows(first: int) -> tuple[float, float]:
        buffers = ReductionBuffers(t.shape[1], t.shape[3], t.dtype, t.device)
        direct = exchange = 0.0
        for i in range(first, t.shape[0], workers):
            if diagonal_block:
                i_col = i + row_offset
                d_low, x_low = orbital_row_sums(t[i, :, :i_col], denom_row[i], denom_col[:i_col],
                                                with_exchange, buffers)
                d_diag, x_diag = orbital_row_sums(t[i, :, i_col:i_col + 1], denom_row[i],
                                                  denom_col[i_col:i_col + 1], with_exchange,
                                                  buffers)
                direct += 2.0 * d_low + d_diag
                exchange += 2.0 * x_low + x_diag
            else:
                d, x = orbital_row_sums(t[i], denom_row[i], denom_col, with_exchange, buffers)
                direct += d
                exchange += x
        return direct, exchange

    with single_threaded_ops():
        if workers == 1:
            parts = [rows(0)]
        else:
            with ThreadPoolExecutor(max_workers=workers) as pool:
                parts = list(pool.map(rows, range(workers)))
    return math.fsum(p[0] for p in parts), math.fsum(p[1] for p in parts)


class TorchKernels:
    """The kernel set on torch: fp64 or fp32 contractions, fp64 energy sums."""

    backend = "torch"

    def __init__(self, precision: str = "fp64", device: torch.device | None = None,
                 accounting: KernelAccounting | None = None) -> None:
        self.precision = precision
        self.dtype = DTYPES[precision]
        self.device = device if device is not None else resolve_device(None)
        self.accounting = accounting if accounting is not None else KernelAccounting()
        self.executor = f"torch-{self.device.type}"

    def report(self) -> dict:
        """Backend-specific facts for the run record (none beyond the call counts here)."""
        return {}

    def hand_over_launches(self) -> None:
        """Nothing counted beyond the calls."""
        return None

    def absorb_launches(self, tally: object) -> None:
        """Nothing to add: torch counts no launches."""

    def gemm(self, a: torch.Tensor, b: torch.Tensor,
             out: torch.Tensor | None = None) -> torch.Tensor:
        self.accounting.record("gemm", self.executor)
        return torch.matmul(a, b) if out is None else torch.matmul(a, b, out=out)

    def transform_gemm(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        # torch accumulates in the operands' precision: fp64 needs no split, and fp32 torch is
        # the user's explicit choice (or the NKI fallback), so this is the plain product
        self.accounting.record("transform_gemm", self.executor)
        return torch.matmul(a, b)

    def syrk(self, a: torch.Tensor, row_unit: int,
             out: torch.Tensor | None = None) -> torch.Tensor:
        self.accounting.record("syrk", self.executor)
        n = a.shape[0]
        if out is None:
            out = torch.empty((n, n), dtype=a.dtype, device=a.device)
        stripe = _stripe(row_unit, n)
        for r0 in range(0, n, stripe):
            r1 = min(n, r0 + stripe)
            out[r0:r1, :r1] = a[r0:r1] @ a[:r1].T
        return out

    def trsm(self, l: torch.Tensor, b: torch.Tensor,
             out: torch.Tensor | None = None) -> torch.Tensor:
        self.accounting.record("trsm", self.executor)
        return torch.linalg.solve_triangular(l, b, upper=False, out=out)

    def mp2_energy(self, pair_block: torch.Tensor, denom_row: torch.Tensor,
                   denom_col: torch.Tensor, nvir: int,
                   diagonal_block: bool) -> tuple[float, float]:
        self.accounting.record("mp2_energy", self.executor)
        ni, nj = pair_block.shape[0] // nvir, pair_block.shape[1] // nvir
        t = pair_block.reshape(ni, nvir, nj, nvir)
        return pair_block_sums(t, denom_row.reshape(ni, nvir), denom_col.reshape(nj, nvir),
                               diagonal_block, workers=torch.get_num_threads())

    def mp2_energy_os(self, pair_block: torch.Tensor, denom_row: torch.Tensor,
                      denom_col: torch.Tensor, nvir_row: int, nvir_col: int) -> float:
        self.accounting.record("mp2_energy", self.executor)
        ni, nj = pair_block.shape[0] // nvir_row, pair_block.shape[1] // nvir_col
        t = pair_block.reshape(ni, nvir_row, nj, nvir_col)
        return pair_block_sums(t, denom_row.reshape(ni, nvir_row), denom_col.reshape(nj, nvir_col),
                               False, with_exchange=False, workers=torch.get_num_threads())[0]

    def mp2_energy_os_fused(self, b_row: torch.Tensor, b_col: torch.Tensor,
                            denom_row: torch.Tensor, denom_col: torch.Tensor, nvir_row: int,
                            nvir_col: int) -> float:
        self.accounting.record("mp2_energy", self.executor)
        ni, nj = b_row.shape[1] // nvir_row, b_col.shape[1] // nvir_col
        d_row, d_col = denom_row.reshape(ni, nvir_row), denom_col.reshape(nj, nvir_col)
        stripe = _stripe(nvir_row) // nvir_row
        direct = 0.0
        for i0 in range(0, ni, stripe):
            i1 = min(ni, i0 + stripe)
            tile = (b_row[:, i0 * nvir_row:i1 * nvir_row].T @ b_col).view(
                i1 - i0, nvir_row, nj, nvir_col)
            direct += pair_block_sums(tile, d_row[i0:i1], d_col, False, with_exchange=False,
                                      workers=torch.get_num_threads())[0]
        return direct

    def mp2_energy_fused(self, b_row: torch.Tensor, b_col: torch.Tensor, denom_row: torch.Tensor,
                         denom_col: torch.Tensor, nvir: int,
                         diagonal_block: bool) -> tuple[float, float]:
        self.accounting.record("mp2_energy", self.executor)
        ni, nj = b_row.shape[1] // nvir, b_col.shape[1] // nvir
        d_row = denom_row.reshape(ni, nvir)
        d_col = denom_col.reshape(nj, nvir)
        stripe = _stripe(nvir) // nvir
        direct = exchange = 0.0
        for i0 in range(0, ni, stripe):
            i1 = min(ni, i0 + stripe)
            j1 = i1 if diagonal_block else nj
            tile = b_row[:, i0 * nvir:i1 * nvir].T @ b_col[:, :j1 * nvir]
            d, x = pair_block_sums(tile.view(i1 - i0, nvir, j1, nvir), d_row[i0:i1],
                                   d_col[:j1], diagonal_block, row_offset=i0,
                                   workers=torch.get_num_threads())
            direct += d
            exchange += x
        return direct, exchange
