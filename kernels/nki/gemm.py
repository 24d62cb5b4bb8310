"""NKI kernel: c = a_t.T @ b in fp32 on the Tensor Engine.

Operands (all fp32, HBM):
- ``a_t`` (K, M): the left factor already transposed, contraction K on the partition axis.
  This is the natural *stationary* layout of ``nisa.nc_matmul`` (stationary[K, M]).
- ``b`` (K, N): the right factor, contraction K on the partition axis: the *moving* layout.
- returns ``c`` (M, N), allocated in ``nl.shared_hbm``.

Shape limits, asserted at trace time (the host, ``kernels/nki_host/gemm.py``, pads with zeros
and splits to meet them): K and M multiples of TILE (128); N a multiple of TILE (the last
TILE_N = 512-column tile may be narrower) and at most GEMM_MAX_N (1024: two PSUM banks live
per output row block); (K/128) * N * 4 bytes <= GEMM_STRIP_BYTES (96 KiB) per partition (the
whole ``b`` strip stays resident in SBUF). Constants from ``kernels/trn1.py``.

Trainium features used:
- SBUF residency: the (K, N) strip of ``b`` is loaded once per launch and stays in SBUF; each
  128x128 tile of ``a_t`` is loaded exactly once. Every input element crosses HBM once.
- Stationary reuse: for each (m, k) the 128x128 stationary tile of ``a_t`` is used by all the
  moving 128x512 tiles of ``b`` of that k back to back, so the systolic array keeps its weights.
- PSUM accumulation: one PSUM bank per 512-column output tile accumulates the K/128 partial
  products with explicit ``accumulate=(k != 0)``; one ``nisa.tensor_copy`` (Vector Engine) moves
  the finished tile to SBUF and one DMA stores it.
- Engines side by side: DMA queues (loads / stores), Tensor Engine (matmuls) and Vector Engine
  (PSUM evacuation) work on different tiles at the same time.
"""
import nki
import nki.language as nl

from kernels.nki.tiling import load_strip, product_block_to_hbm
from kernels.trn1 import FP32_BYTES, GEMM_MAX_N, GEMM_STRIP_BYTES, TILE


@nki.jit
def gemm_kernel(a_t, b):
    k_size, m_size = a_t.shape
    n_size = b.shape[1]
    assert a_t.dtype == nl.float32 and b.dtype == nl.float32, (
        f"gemm_kernel: operands must be fp32, got {a_t.dtype} and {b.dtype}")
    assert b.shape[0] == k_size, f"gemm_kernel: a_t {a_t.shape} and b {b.shape} differ in K"
    assert k_size % TILE == 0 and m_size % TILE == 0, (
        f"gemm_kernel: K={k_size} and M={m_size} must be multiples of {TILE}")
    assert n_size % TILE == 0 and n_size <= GEMM_MAX_N, (
        f"gemm_kernel: N={n_size} must be a multiple of {TILE}, at most {GEMM_MAX_N}")
    k_tiles = k_size // TILE
    assert k_tiles * n_size * FP32_BYTES <= GEMM_STRIP_BYTES, (
        f"gemm_kernel: the resident b strip ({k_size} x {n_size}) exceeds {GEMM_STRIP_BYTES} B "
        "per partition")
    c = nl.ndarray((m_size, n_size), dtype=nl.float32, buffer=nl.shared_hbm)

    # The whole moving strip of b stays resident: tile k occupies columns k*N .. (k+1)*N.
    b_res = nl.ndarray((TILE, k_tiles * n_size), dtype=nl.float32, buffer=nl.sbuf)
    load_strip(b_res, b, k_tiles, n_size, 0, n_size)

    for m in nl.static_range(m_size // TILE):
        # a_t is streamed (each tile is used by one block row only); b is the resident strip
        product_block_to_hbm(c, m * TILE, k_tiles, b_res, n_size, n_size, 0, a_t)
    return c
