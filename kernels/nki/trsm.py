"""NKI kernel: X with L X = B for lower-triangular L, by block forward substitution in fp32.

    X_k = inv(L_kk) (B_k - sum_{j<k} L_kj X_j)      over 128-row blocks k = 0 .. n/128 - 1

Operands (all fp32, HBM):
- ``lt`` (n, n): L transposed (``lt[j, k] = L[k, j]``). Its block (j, k) is L_kj^T, exactly the
  stationary[K=j, M=k] operand whose ``nc_matmul`` with moving X_j gives L_kj X_j.
- ``dinv_t`` (n, 128): block k (rows 128k .. 128k+127) holds inv(L_kk)^T, the stationary operand
  that applies inv(L_kk). The host computes these inverses once per metric in fp64.
- ``b`` (n, m): the right-hand sides, rows on the partition axis (the moving layout).
- returns ``x`` (n, m) in ``nl.shared_hbm``.

Shape limits, asserted at trace time (the host, ``kernels/nki_host/trsm.py``, pads L with an
identity block and B with zero rows): n a multiple of TILE (128); m a multiple of TILE (column
strips of TILE_N = 512, the last one narrower). SBUF holds one strip of solved row blocks:
(n / 128) * 2 KiB per partition, so n <= TRSM_MAX_N (10240, 80 blocks). Constants from
``kernels/trn1.py``.

Trainium features used:
- One launch performs the whole substitution for every column strip of B: the sequential
  dependency between row blocks stays on chip.
- SBUF residency: the solved row blocks X_j of the current 512-column strip stay in SBUF and
  are the moving operands of the updates of every later block (never re-read from HBM).
- PSUM accumulation of sum_j L_kj X_j over j with explicit ``accumulate=(j != 0)``; the Vector
  Engine subtracts it from B_k (``tensor_tensor`` with one operand in PSUM), the Tensor Engine
  applies inv(L_kk), ``nisa.tensor_copy`` moves X_k to SBUF where it stays and is stored.
- Engines side by side: DMA prefetches L blocks and B tiles while the Tensor and Vector
  engines work on the previous block.
"""
import nki
import nki.isa as nisa
import nki.language as nl

from kernels.trn1 import TILE, TILE_N, TRSM_MAX_N


@nki.jit
def trsm_kernel(lt, dinv_t, b):
    n_size, m_size = b.shape
    assert lt.shape == (n_size, n_size), f"trsm_kernel: lt {lt.shape} must be ({n_size}, {n_size})"
    assert dinv_t.shape == (n_size, TILE), (
        f"trsm_kernel: dinv_t {dinv_t.shape} must be ({n_size}, {TILE})")
    assert n_size % TILE == 0 and m_size % TILE == 0, (
        f"trsm_kernel: n={n_size} and m={m_size} must be multiples of {TILE}")
    assert n_size <= TRSM_MAX_N, (
        f"trsm_kernel: n={n_size} exceeds {TRSM_MAX_N} (the solved blocks of a strip stay in SBUF)")
    x = nl.ndarray((n_size, m_size), dtype=nl.float32, buffer=nl.shared_hbm)

    n_blocks = n_size // TILE
    n_strips = (m_size + TILE_N - 1) // TILE_N

    # solved row blocks of the current strip: block j occupies columns j*TILE_N .. j*TILE_N + width
    # (one buffer reused by every strip, so n/128 * 2 KiB per partition bounds the SBUF use)
    x_res = nl.ndarray((TILE, n_blocks * TILE_N), dtype=nl.float32, buffer=nl.sbuf)
    for s in nl.static_range(n_strips):
        c0 = s * TILE_N
        width = min(TILE_N, m_size - c0)
        for k in nl.static_range(n_blocks):
            b_tile = nl.ndarray((TILE, TILE_N), dtype=nl.float32, buffer=nl.sbuf)
            nisa.dma_copy(dst=b_tile[0:TILE, 0:width],
                          src=b[k * TILE:(k + 1) * TILE, c0:c0 + width])
            rhs = b_tile
            if k > 0:
                update = nl.ndarray((TILE, TILE_N), dtype=nl.float32, buffer=nl.psum)
                for j in nl.static_range(k):
                    l_tile = nl.ndarray((TILE, TILE), dtype=nl.float32, buffer=nl.sbuf)
                    nisa.dma_copy(dst=l_tile,
                                  src=lt[j * TILE:(j + 1) * TILE, k * TILE:(k + 1) * TILE])
                    nisa.nc_matmul(dst=update[0:TILE, 0:width], stationary=l_tile,
                                   moving=x_res[0:TILE, j * TILE_N:j * TILE_N + width],
                                   accumulate=(j != 0))
                r_tile = nl.ndarray((TILE, TILE_N), dtype=nl.float32, buffer=nl.sbuf)
                nisa.tensor_tensor(dst=r_tile[0:TILE, 0:width], data1=b_tile[0:TILE, 0:width],
                                   data2=update[0:TILE, 0:width], op=nl.subtract)
                rhs = r_tile
            d_tile = nl.ndarray((TILE, TILE), dtype=nl.float32, buffer=nl.sbuf)
            nisa.dma_copy(dst=d_tile, src=dinv_t[k * TILE:(k + 1) * TILE, 0:TILE])
            x_psum = nl.ndarray((TILE, TILE_N), dtype=nl.float32, buffer=nl.psum)
            nisa.nc_matmul(dst=x_psum[0:TILE, 0:width], stationary=d_tile,
                           moving=rhs[0:TILE, 0:width], accumulate=False)
            nisa.tensor_copy(dst=x_res[0:TILE, k * TILE_N:k * TILE_N + width],
                             src=x_psum[0:TILE, 0:width])
            nisa.dma_copy(dst=x[k * TILE:(k + 1) * TILE, c0:c0 + width],
                          src=x_res[0:TILE, k * TILE_N:k * TILE_N + width])
    return x
