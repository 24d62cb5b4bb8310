"""NKI kernel: fused opposite-spin (alpha-beta) DF-MP2 energy; T tiles live only in PSUM.

For a block of alpha rows r = (i, a) and beta columns c = (j, b):

    T[r, c]  = sum_Q b_row[Q, r] b_col[Q, c]                      (Tensor Engine, PSUM)
    direct  += sum_rc T[r, c]^2 / (denom_row[r] + denom_col[c])

There is no exchange term (the alpha and beta virtual spaces differ) and no pair symmetry, and
the denominator is separable in r and c, so the sum needs no (i, j) pair structure: the kernel
treats the block as one flat (rows x cols) matrix and never sees nvir_row, nvir_col or the
orbital counts (the host only checks that they divide the sizes).

Operands (all fp32, HBM):
- ``b_row`` (naux, n_rows) and ``b_col`` (naux, n_cols): fitted DF blocks of the alpha (i, a)
  and beta (j, b) pairs, the auxiliary index on the partition axis (the natural stationary /
  moving layout).
- ``denom_row`` (n_rows, 1): e_i - e_a, one value per partition row of a tile.
- ``denom_col`` (1, n_cols): e_j - e_b.
- ``resident`` (compile-time int, decided by the host): 1 keeps the b_col block and one
  128-column b_row strip in SBUF, which needs (naux/128)*(n_cols+128)*4 <= OS_STRIP_BYTES
  bytes per partition; 0 streams their tiles from HBM at each use.
- ``col_group`` (compile-time int, decided by the host): T tiles (PSUM banks) accumulating
  side by side per stationary tile, at most OS_COL_GROUP.
- returns ``partials`` (128, r_tiles*c_tiles) in ``nl.shared_hbm``: column ``rt*c_tiles + ct``
  holds the per-partition direct sum of tile (rt, ct) (128 rows x 512 columns, ragged last
  tiles); unused rows hold 0. The host reduces them in fp64.

Shape limits, asserted at trace time (the host is ``kernels/nki_host/mp2_energy_os.py``): naux
a multiple of TILE = 128 (zero rows contribute 0); any n_rows; n_cols <= OS_MAX_COLS (2048)
keeps the per-partition SBUF small (the host launches column chunks); ragged last tiles (tile
sizes never come from divisors of the virtual counts). Padded rows / columns need zero B
columns and finite denominators with nonzero sums.

Trainium features used:
- PSUM accumulation over the naux/128 tiles of each (128 x 512) T tile with explicit
  ``accumulate=(k != 0)``; stationary reuse: one 128 x 128 stationary per k serves up to
  ``col_group`` column tiles (``col_group`` PSUM banks accumulating side by side).
- T is never written to HBM and not even copied to SBUF: the Vector Engine reads each T tile
  straight from PSUM (one PSUM operand per ``tensor_tensor``). Only the partials leave chip.
- The column denominators are broadcast to all partitions once per launch by a K=1 matmul
  against a ones row (exact in fp32); the row denominators enter as the per-partition (P, 1)
  operand of ``tensor_scalar``.
- Vector Engine per tile: D (``tensor_scalar`` add), 1/D (``reciprocal``), T/D and T^2/D
  (``tensor_tensor``) and one free-axis ``tensor_reduce`` into the partials. No
  partition-axis reductions, no tensor-tensor divide.
"""
import nki
import nki.language as nl

from kernels.nki.pair_reduction import (column_denominators, open_partials, reduce_direct_tile,
                                        row_denominators, store_partials)
from kernels.nki.tiling import accumulate_products, load_strip
from kernels.trn1 import FP32_BYTES, OS_COL_GROUP, OS_MAX_COLS, OS_STRIP_BYTES, TILE, TILE_N


@nki.jit
def mp2_energy_os_fused_kernel(b_row, b_col, denom_row, denom_col, resident, col_group):
    naux, n_rows = b_row.shape
    n_cols = b_col.shape[1]
    assert naux % TILE == 0 and b_col.shape[0] == naux, (
        f"mp2_energy_os_fused_kernel: b_row {b_row.shape} and b_col {b_col.shape} need the same "
        f"naux, a multiple of {TILE}")
    assert denom_row.shape == (n_rows, 1) and denom_col.shape == (1, n_cols), (
        f"mp2_energy_os_fused_kernel: denom_row {denom_row.shape} and denom_col "
        f"{denom_col.shape} must be ({n_rows}, 1) and (1, {n_cols})")
    assert n_cols <= OS_MAX_COLS, (
        f"mp2_energy_os_fused_kernel: {n_cols} columns exceed {OS_MAX_COLS}")
    assert resident in (0, 1), (
        f"mp2_energy_os_fused_kernel: resident must be 0 or 1, got {resident}")
    assert 1 <= col_group <= OS_COL_GROUP, (
        f"mp2_energy_os_fused_kernel: col_group={col_group} must be 1 .. {OS_COL_GROUP}")
    x_tiles = naux // TILE
    assert resident == 0 or x_tiles * (n_cols + TILE) * FP32_BYTES <= OS_STRIP_BYTES, (
        f"mp2_energy_os_fused_kernel: resident b_col ({naux} x {n_cols}) and b_row strip exceed "
        f"{OS_STRIP_BYTES} B per partition")
    r_tiles = (n_rows + TILE - 1) // TILE
    c_tiles = (n_cols + TILE_N - 1) // TILE_N
    n_slots = r_tiles * c_tiles

    partials, part_sb = open_partials(n_slots)
    # One 'orbital' spanning all rows and columns: dcb[p, c] = denom_col[0, c] on every
    # partition, and column rt of drs holds denom_row[rt*128 + p] on partition p.
    dcb = column_denominators(denom_col, 1, n_cols, c_tiles)
    drs = row_denominators(denom_row, 1, n_rows, r_tiles)

    brow = None
    bcol = None
    if resident == 1:
        # b_col block: k-tile k occupies columns k*n_cols .. (k+1)*n_cols; loaded once.
        bcol = nl.ndarray((TILE, x_tiles * n_cols), dtype=nl.float32, buffer=nl.sbuf)
        load_strip(bcol, b_col, x_tiles, n_cols, 0, n_cols)
        # b_row strip of one row tile (one buffer, reused by every row tile)
        brow = nl.ndarray((TILE, x_tiles * TILE), dtype=nl.float32, buffer=nl.sbuf)

    for rt in nl.static_range(r_tiles):
        r0 = rt * TILE
        pr = min(TILE, n_rows - r0)
        if resident == 1:
            load_strip(brow, b_row, x_tiles, TILE, r0, pr)
        for ct0 in nl.static_range(0, c_tiles, col_group):
            reduce_column_group(part_sb, dcb, drs, rt, ct0, min(col_group, c_tiles - ct0),
                                c_tiles, n_rows, n_cols, x_tiles, resident, brow, bcol, b_row,
                                b_col)

    store_partials(partials, part_sb, n_slots)
    return partials


def reduce_column_group(part_sb, dcb, drs, rt, ct0, n_ct, c_tiles, n_rows, n_cols, x_tiles,
                        resident, brow, bcol, b_row, b_col):
    """T tiles (rt, ct0 .. ct0 + n_ct - 1) accumulate in n_ct PSUM banks side by side (one
    stationary per auxiliary tile serves them all); each is reduced straight from PSUM into
    partial column rt*c_tiles + ct."""
    r0 = rt * TILE
    pr = min(TILE, n_rows - r0)
    c_first = ct0 * TILE_N
    acc = accumulate_products(x_tiles, pr,
                              resident, brow, TILE, 0, b_row, r0,
                              resident, bcol, n_cols, c_first, b_col, c_first,
                              min(n_cols, c_first + n_ct * TILE_N) - c_first)
    for q in nl.static_range(n_ct):
        c0 = c_first + q * TILE_N
        wc = min(TILE_N, n_cols - c0)
        reduce_direct_tile(acc[q][0:pr, 0:wc], dcb, drs[0:pr, rt:rt + 1], part_sb, pr, wc, c0,
                           rt * c_tiles + ct0 + q)
