"""Tile-level building blocks shared by the kernels: resident strips, operand tiles, PSUM
accumulation of products, PSUM -> HBM stores and partition broadcasts of a row.

Called from inside ``@nki.jit`` kernels and traced with them. Conventions: a *strip* is a
(K, width) HBM operand held in SBUF as K/TILE row tiles laid side by side along the free axis
(row tile k at columns ``k*stride .. k*stride + width``), so every contraction tile is a slice
of it; a *streamed* operand is loaded tile by tile from HBM at each use instead.
"""
import nki.isa as nisa
import nki.language as nl

from kernels.trn1 import TILE, TILE_N


def load_strip(strip, src, k_tiles, stride, src_col0, width):
    """Copy src[k*TILE:(k+1)*TILE, src_col0:src_col0 + width] into strip columns
    k*stride .. k*stride + width for every k < k_tiles (one DMA per row tile)."""
    for k in nl.static_range(k_tiles):
        nisa.dma_copy(dst=strip[0:TILE, k * stride:k * stride + width],
                      src=src[k * TILE:(k + 1) * TILE, src_col0:src_col0 + width])


def operand_tile(resident, strip, strip_col0, src, k, src_col0, width, tile_width):
    """The (TILE, width) operand of contraction tile k: the strip's slice at strip_col0 when
    ``resident`` is 1, else a fresh (TILE, tile_width) SBUF tile loaded from src (streamed)."""
    if resident == 1:
        return strip[0:TILE, strip_col0:strip_col0 + width]
    tile = nl.ndarray((TILE, tile_width), dtype=nl.float32, buffer=nl.sbuf)
    nisa.dma_copy(dst=tile[0:TILE, 0:width],
                  src=src[k * TILE:(k + 1) * TILE, src_col0:src_col0 + width])
    return tile[0:TILE, 0:width]


def psum_tiles(count):
    """``count`` (TILE, TILE_N) fp32 PSUM tiles (one bank each), accumulating side by side."""
    tiles = []
    for _ in nl.static_range(count):
        tiles.append(nl.ndarray((TILE, TILE_N), dtype=nl.float32, buffer=nl.psum))
    return tiles


def accumulate_products(k_tiles, rows,
                        row_resident, row_strip, row_stride, row_strip_col0, row_src, row_src_col0,
                        col_resident, col_strip, col_stride, col_strip_col0, col_src, col_src_col0,
                        col_end):
    """New PSUM tiles acc[q][0:rows, 0:w] = sum_k row_k^T col_kq over the k_tiles contraction
    tiles, one per TILE_N-wide column tile q of [0, col_end): one stationary (TILE, rows)
    operand per k serves every column tile back to back (stationary reuse);
    accumulate=(k != 0).

    Row operand of tile k: columns ``row_src_col0 .. + rows`` of row_src, or, resident, of
    row_strip at ``k*row_stride + row_strip_col0``. Column operand of tile (k, q): columns
    ``col_src_col0 + q*TILE_N ..`` of col_src, or, resident, of col_strip at
    ``k*col_stride + col_strip_col0 + q*TILE_N``.

    Call it once per output block from a helper that consumes the tiles before returning, so
    that the banks of one block are released before the next block's are allocated."""
    acc = psum_tiles((col_end + TILE_N - 1) // TILE_N)
    for k in nl.static_range(k_tiles):
        stationary = operand_tile(row_resident, row_strip, k * row_stride + row_strip_col0,
                                  row_src, k, row_src_col0, rows, TILE)
        for q in nl.static_range(len(acc)):
            c0 = q * TILE_N
            width = min(TILE_N, col_end - c0)
            moving = operand_tile(col_resident, col_strip, k * col_stride + col_strip_col0 + c0,
                                  col_src, k, col_src_col0 + c0, width, TILE_N)
            nisa.nc_matmul(dst=acc[q][0:rows, 0:width], stationary=stationary, moving=moving,
                           accumulate=(k != 0))
    return acc


def product_block_to_hbm(out, row0, k_tiles, strip, stride, col_end, rows_resident, row_src):
    """out[row0:row0 + TILE, 0:col_end] = a^T b for a = columns row0 .. row0 + TILE of the row
    operand and b = the resident (K, col_end) strip (tile k at columns k*stride ..): through
    PSUM (see :func:`accumulate_products`) and SBUF. The row operand is a slice of the same
    strip when ``rows_resident`` is 1 (a symmetric product), else streamed from ``row_src``."""
    acc = accumulate_products(k_tiles, TILE,
                              rows_resident, strip, stride, row0, row_src, row0,
                              1, strip, stride, 0, None, 0, col_end)
    store_psum_tiles(out, row0, acc, col_end)


def store_psum_tiles(out, row0, acc, col_end):
    """Store acc[q][0:TILE, 0:w] into out[row0:row0 + TILE, q*TILE_N ..] for the column tiles
    of [0, col_end): PSUM -> SBUF on the Vector Engine (DMA cannot read PSUM), then DMA."""
    for q in nl.static_range(len(acc)):
        c0 = q * TILE_N
        width = min(TILE_N, col_end - c0)
        staged = nl.ndarray((TILE, TILE_N), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_copy(dst=staged[0:TILE, 0:width], src=acc[q][0:TILE, 0:width])
        nisa.dma_copy(dst=out[row0:row0 + TILE, c0:c0 + width], src=staged[0:TILE, 0:width])


def ones_row():
    """A (1, TILE) row of ones: the stationary operand of partition broadcasts."""
    ones = nl.ndarray((1, TILE), dtype=nl.float32, buffer=nl.sbuf)
    nisa.memset(dst=ones, value=1.0)
    return ones


def broadcast_row(dst, dst_col0, src, src_row, src_col0, width, ones):
    """dst[p, dst_col0 + c] = src[src_row, src_col0 + c] on all TILE partitions, for
    c < width <= TILE_N: a K=1 Tensor Engine matmul against ``ones`` (exact in fp32)."""
    row = nl.ndarray((1, TILE_N), dtype=nl.float32, buffer=nl.sbuf)
    nisa.dma_copy(dst=row[0:1, 0:width], src=src[src_row:src_row + 1, src_col0:src_col0 + width])
    spread = nl.ndarray((TILE, TILE_N), dtype=nl.float32, buffer=nl.psum)
    nisa.nc_matmul(dst=spread[0:TILE, 0:width], stationary=ones, moving=row[0:1, 0:width],
                   accumulate=False)
    nisa.tensor_copy(dst=dst[0:TILE, dst_col0:dst_col0 + width], src=spread[0:TILE, 0:width])
