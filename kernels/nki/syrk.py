"""NKI kernel: c = a_t.T @ a_t (a symmetric rank-K update) in fp32, lower 128-blocks only.

Operands (all fp32, HBM):
- ``a_t`` (K, N): the factor with the contraction K on the partition axis. Its column blocks are
  both the stationary (K x 128) and the moving (K x <=512) operands of ``nisa.nc_matmul``.
- returns ``c`` (N, N) in ``nl.shared_hbm``: every 128x128 block on or below the diagonal holds
  ``a_t.T @ a_t``; every block above the diagonal is written as zeros (the output is fully
  defined). The host mirrors the lower blocks when it needs the full matrix.

Shape limits (the host pads with zero rows / columns and splits larger problems into syrk
diagonal blocks plus gemm off-diagonal blocks): K and N multiples of 128, N <= 1024,
(K/128) * N * 4 bytes <= 96 KiB per partition (the whole ``a_t`` stays resident in SBUF).

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
import nki.language as nl
import nki.isa as nisa

TILE_K = 128  # contraction rows per matmul (partition dim)
TILE_M = 128  # output rows per matmul (stationary free size); also the diagonal block size
TILE_N = 512  # output columns per matmul (moving free size, one fp32 PSUM bank)


@nki.jit
def syrk_kernel(a_t):
    k_size, n_size = a_t.shape
    c = nl.ndarray((n_size, n_size), dtype=nl.float32, buffer=nl.shared_hbm)

    k_tiles = k_size // TILE_K
    m_tiles = n_size // TILE_M

    a_res = nl.ndarray((TILE_K, k_tiles * n_size), dtype=nl.float32, buffer=nl.sbuf)
    for k in nl.static_range(k_tiles):
        nisa.dma_copy(dst=a_res[0:TILE_K, k * n_size:(k + 1) * n_size],
                      src=a_t[k * TILE_K:(k + 1) * TILE_K, 0:n_size])

    zero_tile = nl.ndarray((TILE_M, n_size), dtype=nl.float32, buffer=nl.sbuf)
    nisa.memset(dst=zero_tile, value=0.0)

    for m in nl.static_range(m_tiles):
        row_width = (m + 1) * TILE_M  # columns 0 .. row_width are on or below the diagonal
        n_tiles = (row_width + TILE_N - 1) // TILE_N
        acc = []
        for n in nl.static_range(n_tiles):
            acc.append(nl.ndarray((TILE_M, TILE_N), dtype=nl.float32, buffer=nl.psum))
        for k in nl.static_range(k_tiles):
            stationary = a_res[0:TILE_K, k * n_size + m * TILE_M:k * n_size + (m + 1) * TILE_M]
            for n in nl.static_range(n_tiles):
                n0 = n * TILE_N
                width = min(TILE_N, row_width - n0)
                nisa.nc_matmul(dst=acc[n][0:TILE_M, 0:width], stationary=stationary,
                               moving=a_res[0:TILE_K, k * n_size + n0:k * n_size + n0 + width],
                               accumulate=(k != 0))
        for n in nl.static_range(n_tiles):
            n0 = n * TILE_N
            width = min(TILE_N, row_width - n0)
            c_tile = nl.ndarray((TILE_M, TILE_N), dtype=nl.float32, buffer=nl.sbuf)
            nisa.tensor_copy(dst=c_tile[0:TILE_M, 0:width], src=acc[n][0:TILE_M, 0:width])
            nisa.dma_copy(dst=c[m * TILE_M:(m + 1) * TILE_M, n0:n0 + width],
                          src=c_tile[0:TILE_M, 0:width])
        if row_width < n_size:
            nisa.dma_copy(dst=c[m * TILE_M:(m + 1) * TILE_M, row_width:n_size],
                          src=zero_tile[0:TILE_M, 0:n_size - row_width])
    return c
