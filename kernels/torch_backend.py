"""PyTorch implementations of the four kernels, in fp64 or fp32, on any torch device."""
from __future__ import annotations

from contextlib import contextmanager

import torch

from kernels.accounting import KernelAccounting

DTYPES = {"fp64": torch.float64, "fp32": torch.float32}
# Row stripes of at least this many rows keep each GEMM of syrk and of the fused energy
# large enough to run near the BLAS peak.
MIN_STRIPE_ROWS = 512
# Elements per elementwise tile of the energy reduction: a few such tiles fit in L2.
CACHE_TILE_ELEMENTS = 2**17


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


def _stripe(block: int) -> int:
    """Rows per stripe: a whole number of ``block``-row units, at least MIN_STRIPE_ROWS rows."""
    return block * max(1, -(-MIN_STRIPE_ROWS // block))


def orbital_row_sums(t_row: torch.Tensor, denom_a: torch.Tensor, denom_col: torch.Tensor,
                     with_exchange: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """(direct, exchange) fp64 sums for one occupied orbital i against a set of orbitals j.

    ``t_row`` is (nvir_i, nj, nvir_j) holding (ia|jb) as [a, j, b]; ``denom_a`` is e_i - e_a
    and ``denom_col`` is e_j - e_b (nj, nvir_j). Without exchange (opposite spins, where the
    virtual spaces differ) only the direct sum is formed. The j range is walked in chunks of
    about CACHE_TILE_ELEMENTS so that the few elementwise passes stay in cache.
    """
    nvir_i, nj, nvir_j = t_row.shape
    chunk = max(1, CACHE_TILE_ELEMENTS // (nvir_i * nvir_j))
    direct = torch.zeros((), dtype=torch.float64, device=t_row.device)
    exchange = torch.zeros((), dtype=torch.float64, device=t_row.device)
    for j0 in range(0, nj, chunk):
        tile = t_row[:, j0:j0 + chunk]
        scaled = tile / (denom_a[:, None, None] + denom_col[None, j0:j0 + chunk, :])
        direct += torch.sum(scaled * tile, dtype=torch.float64)
        if with_exchange:
            exchange += torch.sum(scaled * tile.permute(2, 1, 0), dtype=torch.float64)
    return direct, exchange


def pair_block_sums(t: torch.Tensor, denom_row: torch.Tensor, denom_col: torch.Tensor,
                    lower_pairs: bool, row_offset: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """(direct, exchange) over a block viewed as t[i, a, j, b] (rows i, cols j).

    ``row_offset`` is the index of t's first row orbital among the column orbitals, used with
    ``lower_pairs`` to keep only pairs i >= j (i > j weighted twice).
    """
    direct = torch.zeros((), dtype=torch.float64, device=t.device)
    exchange = torch.zeros((), dtype=torch.float64, device=t.device)
    for i in range(t.shape[0]):
        if lower_pairs:
            i_col = i + row_offset
            d_low, x_low = orbital_row_sums(t[i, :, :i_col], denom_row[i], denom_col[:i_col])
            d_diag, x_diag = orbital_row_sums(t[i, :, i_col:i_col + 1], denom_row[i],
                                              denom_col[i_col:i_col + 1])
            direct += 2.0 * d_low + d_diag
            exchange += 2.0 * x_low + x_diag
        else:
            d, x = orbital_row_sums(t[i], denom_row[i], denom_col)
            direct += d
            exchange += x
    return direct, exchange


class TorchKernels:
    """The kernel set on torch: fp64 or fp32 contractions, fp64 energy sums."""

    def __init__(self, precision: str = "fp64", device: torch.device | None = None,
                 accounting: KernelAccounting | None = None) -> None:
        self.precision = precision
        self.dtype = DTYPES[precision]
        self.device = device if device is not None else resolve_device(None)
        self.accounting = accounting if accounting is not None else KernelAccounting()
        self.backend = "torch"
        self.executor = f"torch-{self.device.type}"

    def report(self) -> dict:
        """Backend-specific facts for the run record (none beyond the call counts here)."""
        return {}

    def gemm(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        self.accounting.record("gemm", self.executor)
        return torch.matmul(a, b)

    def syrk(self, a: torch.Tensor, block: int) -> torch.Tensor:
        self.accounting.record("syrk", self.executor)
        n = a.shape[0]
        out = torch.empty((n, n), dtype=a.dtype, device=a.device)
        stripe = _stripe(block)
        for r0 in range(0, n, stripe):
            r1 = min(n, r0 + stripe)
            out[r0:r1, :r1] = a[r0:r1] @ a[:r1].T
        return out

    def trsm(self, l: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        self.accounting.record("trsm", self.executor)
        return torch.linalg.solve_triangular(l, b, upper=False)

    def mp2_energy(self, pair_block: torch.Tensor, denom_row: torch.Tensor,
                   denom_col: torch.Tensor, nvir: int, lower_pairs: bool) -> tuple[float, float]:
        self.accounting.record("mp2_energy", self.executor)
        ni, nj = pair_block.shape[0] // nvir, pair_block.shape[1] // nvir
        t = pair_block.reshape(ni, nvir, nj, nvir)
        with single_threaded_ops():
            direct, exchange = pair_block_sums(t, denom_row.reshape(ni, nvir),
                                               denom_col.reshape(nj, nvir), lower_pairs)
        return float(direct), float(exchange)

    def mp2_energy_os(self, pair_block: torch.Tensor, denom_row: torch.Tensor,
                      denom_col: torch.Tensor, nvir_row: int, nvir_col: int) -> float:
        self.accounting.record("mp2_energy", self.executor)
        ni, nj = pair_block.shape[0] // nvir_row, pair_block.shape[1] // nvir_col
        t = pair_block.reshape(ni, nvir_row, nj, nvir_col)
        d_row, d_col = denom_row.reshape(ni, nvir_row), denom_col.reshape(nj, nvir_col)
        with single_threaded_ops():
            direct = sum(float(orbital_row_sums(t[i], d_row[i], d_col, False)[0])
                         for i in range(ni))
        return direct

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
            with single_threaded_ops():
                direct += sum(float(orbital_row_sums(tile[i], d_row[i0 + i], d_col, False)[0])
                              for i in range(i1 - i0))
        return direct

    def mp2_energy_fused(self, b_row: torch.Tensor, b_col: torch.Tensor, denom_row: torch.Tensor,
                         denom_col: torch.Tensor, nvir: int,
                         lower_pairs: bool) -> tuple[float, float]:
        self.accounting.record("mp2_energy", self.executor)
        ni, nj = b_row.shape[1] // nvir, b_col.shape[1] // nvir
        d_row = denom_row.reshape(ni, nvir)
        d_col = denom_col.reshape(nj, nvir)
        stripe = _stripe(nvir) // nvir
        direct = torch.zeros((), dtype=torch.float64, device=b_row.device)
        exchange = torch.zeros((), dtype=torch.float64, device=b_row.device)
        for i0 in range(0, ni, stripe):
            i1 = min(ni, i0 + stripe)
            j1 = i1 if lower_pairs else nj
            tile = b_row[:, i0 * nvir:i1 * nvir].T @ b_col[:, :j1 * nvir]
            with single_threaded_ops():
                d, x = pair_block_sums(tile.view(i1 - i0, nvir, j1, nvir), d_row[i0:i1],
                                       d_col[:j1], lower_pairs, row_offset=i0)
            direct += d
            exchange += x
        return float(direct), float(exchange)
