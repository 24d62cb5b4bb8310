"""NKI kernel: c = a_t.T @ a_t (a symmetric rank-K update) in fp32, lower 128-blocks only.

Operands (all fp32, HBM):
- ``a_t`` (K, N): the factor with the contraction K on the partition axis. Its column blocks are
  both the stationary (K x 128) and the moving (K x <=512) operands of ``nisa.nc_matmul``.
- returns ``c`` (N, N) in ``nl.shared_hbm``: every 128x128 block on or below the diagonal holds
  ``a_t.T @ a_t``; every block above the diagonal is written as zeros (the output is fully
  defined). The host mirrors the lower blocks when it needs the full matrix.

Shape limits, asserted at trace time (the host, ``kernels/nki_host/gemm.py``, pads with zero
rows / columns and splits larger problems into syrk diagonal blocks plus gemm off-diagonal
blocks): K and N multiples of TILE (128), N <= GEMM_MAX_N (1024), (K/128) * N * 4 bytes <=
GEMM_STRIP_BYTES (96 KiB) per partition (the whole ``a_t`` stays resident in SBUF).

Trainium features used:
- SBUF residency: ``a_t`` is loaded once; stationary and moving tiles are slices of it.
- Stationary reuse: for each (row block m, k) the 128x128 stationary tile serves every moving
  tile of that block row back to back.
- Triangular work: block row m only computes columns 0 .. 128*(m+1), in 512-column moving tiles
  (the last one narrower), so about half the Tensor Engine work of the full product.
- PSUM accumulation over K tiles with explicit ``accumulate=(k != 0)``; PSUM -> SBUF with
  ``nisa.tensor_copy`` (Vector Engine); the zero blocks come from one memset tile (GpSimd).
- Engines side by side: DMA, Tensor, Vector and GpSimd engines on independent tiles.
"""
import nki
import nki.isa as nisa
import nki.language as nl

from kernels.nki.tiling import load_strip, product_block_to_hbm
from kernels.trn1 import FP32_BYTES, GEMM_MAX_N, GEMM_STRIP_BYTES, TILE


@nki.jit
def syrk_kernel(a_t):
    k_size, n_size = a_t.shape
    assert k_size % TILE == 0 and n_size % TILE == 0, (
        f"syrk_kernel: K={k_size} and N={n_size} must be multiples of {TILE}")
    assert n_size <= GEMM_MAX_N, f"syrk_kernel: N={n_size} exceeds {GEMM_MAX_N}"
    k_tiles = k_size // TILE
    assert k_tiles * n_size * FP32_BYTES <= GEMM_STRIP_BYTES, (
        f"syrk_kernel: the resident a_t ({k_size} x {n_size}) exceeds {GEMM_STRIP_BYTES} B "
        "per partition")
    c = nl.ndarray((n_size, n_size), dtype=nl.float32, buffer=nl.shared_hbm)

    a_res = nl.ndarray((TILE, k_tiles * n_size), dtype=nl.float32, buffer=nl.sbuf)
    load_strip(a_res, a_t, k_tiles, n_size, 0, n_size)

    zero_tile = nl.ndarray((TILE, n_size), dtype=nl.float32, buffer=nl.sbuf)
    nisa.memset(dst=zero_tile, value=0.0)

    for m in nl.static_range(n_size // TILE):
        row_width = (m + 1) * TILE  # columns 0 .. row_width are on or below the diagonal
        product_block_to_hbm(c, m * TILE, k_tiles, a_res, n_size, row_width, 1, a_t)
        if row_width < n_size:
            nisa.dma_copy(dst=c[m * TILE:(m + 1) * TILE, row_width:n_size],
                          src=zero_tile[0:TILE, 0:n_size - row_width])
    return c
