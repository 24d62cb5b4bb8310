"""NKI kernel: a_t.T @ b as an exact head plus a small tail (exact-head split), in fp32.

Each operand is split on the Vector Engine into a head with at most beta significant bits on a
grid shared by its line, and the exact remainder (the tail):

    a1 = (a + sa) - sa,  a2 = a - a1    per column m of a_t (a row of a): sa[m] = 1.5 2^(e+23-beta)
    b1 = (b + sb) - sb,  b2 = b - b1    per column n of b:                sb[n] = 1.5 2^(f+23-beta)

with 2^e >= max |a| of the line (2^f for b). Adding and subtracting sigma rounds a value of
magnitude <= 2^e onto the grid 2^(e-beta) (the ulp of sigma) in any rounding mode, and both
subtractions are exact, so a = a1 + a2 and b = b1 + b2 exactly. Then

    head = a1.T @ b1                (exact: every partial sum is an integer < 2^24 in the unit
                                     2^(e-beta) 2^(f-beta) when 2 beta + ceil(log2 K) <= 24)
    tail = a1.T @ b2 + a2.T @ b     (2^-beta smaller than the product: its fp32 rounding is
                                     2^-beta of a plain fp32 gemm's)

and a_t.T @ b = head + tail, which the host adds in fp64. Heads of at most 8 bits are exact
bf16 values, so the head products stay exact however the Tensor Engine forms fp32 products.
The host chooses beta (through the sigmas) for the launch's K; see
``kernels/nki_host/gemm_split.py`` and the accuracy section of docs/kernels.md.

Operands (all fp32, HBM):
- ``a_t`` (K, M): the left factor transposed (stationary layout), as in ``gemm_kernel``.
- ``b`` (K, N): the right factor (moving layout).
- ``sa`` (1, M), ``sb`` (1, N): the sigma of each column of ``a_t`` and of ``b``.
- returns ``(head, tail)``, each (M, N) in ``nl.shared_hbm``.

Shape limits, asserted at trace time: K and M multiples of TILE (128); N a multiple of TILE,
at most GEMM_MAX_N (1024); b, its head and its tail stay resident:
(K/128) * N * 4 bytes <= SPLIT_STRIP_BYTES (32 KiB) per partition. Constants from
``kernels/trn1.py``.

Trainium features used:
- The sigma rows are broadcast to all partitions once per launch by K=1 Tensor Engine matmuls
  against a ones row (exact); the splits are Vector Engine ``tensor_tensor`` adds and
  subtracts: b's once per launch, each a_t tile's once (each is loaded once).
- Three matmuls per (m, k, n) tile into two PSUM accumulation groups (head and tail), with the
  stationary a1 serving two of them back to back; the rest as ``gemm_kernel``.
"""
import nki
import nki.isa as nisa
import nki.language as nl

from kernels.nki.tiling import broadcast_row, load_strip, ones_row, psum_tiles, store_psum_tiles
from kernels.trn1 import FP32_BYTES, GEMM_MAX_N, SPLIT_STRIP_BYTES, TILE, TILE_N


@nki.jit
def gemm_split_kernel(a_t, b, sa, sb):
    k_size, m_size = a_t.shape
    n_size = b.shape[1]
    assert b.shape[0] == k_size, f"gemm_split_kernel: a_t {a_t.shape} and b {b.shape} differ in K"
    assert k_size % TILE == 0 and m_size % TILE == 0, (
        f"gemm_split_kernel: K={k_size} and M={m_size} must be multiples of {TILE}")
    assert n_size % TILE == 0 and n_size <= GEMM_MAX_N, (
        f"gemm_split_kernel: N={n_size} must be a multiple of {TILE}, at most {GEMM_MAX_N}")
    assert sa.shape == (1, m_size) and sb.shape == (1, n_size), (
        f"gemm_split_kernel: sa {sa.shape} and sb {sb.shape} must be (1, {m_size}) and "
        f"(1, {n_size})")
    k_tiles = k_size // TILE
    assert k_tiles * n_size * FP32_BYTES <= SPLIT_STRIP_BYTES, (
        f"gemm_split_kernel: the resident b strips ({k_size} x {n_size}, three of them) exceed "
        f"{SPLIT_STRIP_BYTES} B per partition each")
    n_tiles = (n_size + TILE_N - 1) // TILE_N
    head = nl.ndarray((m_size, n_size), dtype=nl.float32, buffer=nl.shared_hbm)
    tail = nl.ndarray((m_size, n_size), dtype=nl.float32, buffer=nl.shared_hbm)

    # sigma of every b column and every a_t column on every partition
    ones = ones_row()
    sb_all = nl.ndarray((TILE, n_size), dtype=nl.float32, buffer=nl.sbuf)
    for n in nl.static_range(n_tiles):
        broadcast_row(sb_all, n * TILE_N, sb, 0, n * TILE_N, min(TILE_N, n_size - n * TILE_N),
                      ones)
    sa_all = nl.ndarray((TILE, m_size), dtype=nl.float32, buffer=nl.sbuf)
    for c in nl.static_range((m_size + TILE_N - 1) // TILE_N):
        broadcast_row(sa_all, c * TILE_N, sa, 0, c * TILE_N, min(TILE_N, m_size - c * TILE_N),
                      ones)

    # resident moving strips: b, its head b1 and its tail b2 (tile k at columns k*N .. (k+1)*N)
    b_res = nl.ndarray((TILE, k_tiles * n_size), dtype=nl.float32, buffer=nl.sbuf)
    b1_res = nl.ndarray((TILE, k_tiles * n_size), dtype=nl.float32, buffer=nl.sbuf)
    b2_res = nl.ndarray((TILE, k_tiles * n_size), dtype=nl.float32, buffer=nl.sbuf)
    load_strip(b_res, b, k_tiles, n_size, 0, n_size)
    for k in nl.static_range(k_tiles):
        c0 = k * n_size
        split_head_tail(b1_res[0:TILE, c0:c0 + n_size], b2_res[0:TILE, c0:c0 + n_size],
                        b_res[0:TILE, c0:c0 + n_size], sb_all)

    for m in nl.static_range(m_size // TILE):
        m0 = m * TILE
        acc_head = psum_tiles(n_tiles)
        acc_tail = psum_tiles(n_tiles)
        for k in nl.static_range(k_tiles):
            a_tile = nl.ndarray((TILE, TILE), dtype=nl.float32, buffer=nl.sbuf)
            a1_tile = nl.ndarray((TILE, TILE), dtype=nl.float32, buffer=nl.sbuf)
            a2_tile = nl.ndarray((TILE, TILE), dtype=nl.float32, buffer=nl.sbuf)
            nisa.dma_copy(dst=a_tile, src=a_t[k * TILE:(k + 1) * TILE, m0:m0 + TILE])
            split_head_tail(a1_tile, a2_tile, a_tile, sa_all[0:TILE, m0:m0 + TILE])
            for n in nl.static_range(n_tiles):
                c0 = k * n_size + n * TILE_N
                width = min(TILE_N, n_size - n * TILE_N)
                nisa.nc_matmul(dst=acc_head[n][0:TILE, 0:width], stationary=a1_tile,
                               moving=b1_res[0:TILE, c0:c0 + width], accumulate=(k != 0))
                nisa.nc_matmul(dst=acc_tail[n][0:TILE, 0:width], stationary=a1_tile,
                               moving=b2_res[0:TILE, c0:c0 + width], accumulate=(k != 0))
                nisa.nc_matmul(dst=acc_tail[n][0:TILE, 0:width], stationary=a2_tile,
                               moving=b_res[0:TILE, c0:c0 + width], accumulate=True)
        store_psum_tiles(head, m0, acc_head, n_size)
        store_psum_tiles(tail, m0, acc_tail, n_size)
    return head, tail


def split_head_tail(head, tail, value, sigma):
    """head = (value + sigma) - sigma, tail = value - head (Vector Engine, exact)."""
    nisa.tensor_tensor(dst=head, data1=value, data2=sigma, op=nl.add)
    nisa.tensor_tensor(dst=head, data1=head, data2=sigma, op=nl.subtract)
    nisa.tensor_tensor(dst=tail, data1=value, data2=head, op=nl.subtract)
