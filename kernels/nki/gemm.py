"""NKI kernel: c = a_t.T @ b in fp32 on the Tensor Engine.

Operands (all fp32, HBM):
- ``a_t`` (K, M): the left factor already transposed, contraction K on the partition axis.
  This is the natural *stationary* layout of ``nisa.nc_matmul`` (stationary[K, M]).
- ``b`` (K, N): the right factor, contraction K on the partition axis: the *moving* layout.
- returns ``c`` (M, N), allocated in ``nl.shared_hbm``.

Shape limits (the host, ``kernels/nki_backend.py``, pads with zeros and splits to meet them):
K and M multiples of 128; N a multiple of 128 (the last 512-column tile may be narrower);
N <= 1024 (two PSUM banks live per output row block); (K/128) * N * 4 bytes <= 96 KiB per
partition (the whole ``b`` strip stays resident in SBUF).

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
import nki.isa as nisa

TILE_K = 128  # contraction rows per matmul: partition dim of stationary and moving tiles
TILE_M = 128  # stationary free size: output rows per matmul
TILE_N = 512  # moving free size: output columns per matmul, one fp32 PSUM bank


@nki.jit
def gemm_kernel(a_t, b):
    k_size, m_size = a_t.shape
    n_size = b.shape[1]
    c = nl.ndarray((m_size, n_size), dtype=nl.float32, buffer=nl.shared_hbm)

    k_tiles = k_size // TILE_K
    m_tiles = m_size // TILE_M
    n_tiles = (n_size + TILE_N - 1) // TILE_N

    # The whole moving strip of b stays resident: tile k occupies columns k*N .. (k+1)*N.
    b_res = nl.ndarray((TILE_K, k_tiles * n_size), dtype=nl.float32, buffer=nl.sbuf)
    for k in nl.static_range(k_tiles):
        nisa.dma_copy(dst=b_res[0:TILE_K, k * n_size:(k + 1) * n_size],
                      src=b[k * TILE_K:(k + 1) * TILE_K, 0:n_size])

    for m in nl.static_range(m_tiles):
        acc = []
        for n in nl.static_range(n_tiles):
            acc.append(nl.ndarray((TILE_M, TILE_N), dtype=nl.float32, buffer=nl.psum))
        for k in nl.static_range(k_tiles):
            a_tile = nl.ndarray((TILE_K, TILE_M), dtype=nl.float32, buffer=nl.sbuf)
            nisa.dma_copy(dst=a_tile,
                          src=a_t[k * TILE_K:(k + 1) * TILE_K, m * TILE_M:(m + 1) * TILE_M])
            for n in nl.static_range(n_tiles):
                n0 = n * TILE_N
                width = min(TILE_N, n_size - n0)
                nisa.nc_matmul(dst=acc[n][0:TILE_M, 0:width], stationary=a_tile,
                               moving=b_res[0:TILE_K, k * n_size + n0:k * n_size + n0 + width],
                               accumulate=(k != 0))
        for n in nl.static_range(n_tiles):
            n0 = n * TILE_N
            width = min(TILE_N, n_size - n0)
            c_tile = nl.ndarray((TILE_M, TILE_N), dtype=nl.float32, buffer=nl.sbuf)
            nisa.tensor_copy(dst=c_tile[0:TILE_M, 0:width], src=acc[n][0:TILE_M, 0:width])
            nisa.dma_copy(dst=c[m * TILE_M:(m + 1) * TILE_M, n0:n0 + width],
                          src=c_tile[0:TILE_M, 0:width])
    return c
