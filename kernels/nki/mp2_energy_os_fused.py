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
- returns ``partials`` (128, r_tiles*c_tiles) in ``nl.shared_hbm``: column ``rt*c_tiles + ct``
  holds the per-partition direct sum of tile (rt, ct) (128 rows x 512 columns, ragged last
  tiles); unused rows hold 0. The host reduces them in fp64.

Shape limits: naux a multiple of 128 (zero rows contribute 0); any n_rows and n_cols (ragged
last tiles; tile sizes never come from divisors of the virtual counts); n_cols <= 2048 keeps
the per-partition SBUF small (the host launches column chunks). Padded rows / columns need
zero B columns and finite denominators with nonzero sums. The b_col block and one b_row strip
(128 rows) stay resident in SBUF when (naux/128)*(n_cols+128)*4 <= STRIP_BYTES bytes per
partition, else their tiles are streamed from HBM per use.

Trainium features used:
- PSUM accumulation over the naux/128 tiles of each (128 x 512) T tile with explicit
  ``accumulate=(k != 0)``; stationary reuse: one 128 x 128 stationary per k serves up to
  COL_GROUP column tiles (COL_GROUP PSUM banks accumulating side by side).
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
import nki.isa as nisa

from kernels.nki.pair_reduction import (column_denominators, reduce_direct_tile,
                                        row_denominators)

TILE_X = 128  # auxiliary rows per matmul (contraction, partition dim)
TILE_R = 128  # rows (i, a) of a T tile (output partitions); = pair_reduction.TILE_A
TILE_C = 512  # columns (j, b) of a T tile (one fp32 PSUM bank); = pair_reduction.TILE_B
COL_GROUP = 4  # T tiles accumulating side by side (PSUM banks) per stationary tile
STRIP_BYTES = 98304  # per-partition SBUF budget of the resident b_col block + b_row strip


@nki.jit
def mp2_energy_os_fused_kernel(b_row, b_col, denom_row, denom_col):
    naux, n_rows = b_row.shape
    n_cols = b_col.shape[1]
    x_tiles = naux // TILE_X
    r_tiles = (n_rows + TILE_R - 1) // TILE_R
    c_tiles = (n_cols + TILE_C - 1) // TILE_C
    n_groups = (c_tiles + COL_GROUP - 1) // COL_GROUP
    n_slots = r_tiles * c_tiles
    resident = x_tiles * (n_cols + TILE_R) * 4 <= STRIP_BYTES

    partials = nl.ndarray((TILE_R, n_slots), dtype=nl.float32, buffer=nl.shared_hbm)
    part_sb = nl.ndarray((TILE_R, n_slots), dtype=nl.float32, buffer=nl.sbuf)
    nisa.memset(dst=part_sb, value=0.0)

    # One 'orbital' spanning all rows and columns: dcb[p, c] = denom_col[0, c] on every
    # partition, and column rt of drs holds denom_row[rt*128 + p] on partition p.
    dcb = column_denominators(denom_col, 1, n_cols, c_tiles)
    drs = row_denominators(denom_row, 1, n_rows, r_tiles)

    if resident:
        # b_col block: k-tile k occupies columns k*n_cols .. (k+1)*n_cols; loaded once.
        bcol = nl.ndarray((TILE_X, x_tiles * n_cols), dtype=nl.float32, buffer=nl.sbuf)
        for k in nl.static_range(x_tiles):
            nisa.dma_copy(dst=bcol[0:TILE_X, k * n_cols:(k + 1) * n_cols],
                          src=b_col[k * TILE_X:(k + 1) * TILE_X, 0:n_cols])
        # b_row strip of one row tile (one buffer, reused by every row tile)
        brow = nl.ndarray((TILE_X, x_tiles * TILE_R), dtype=nl.float32, buffer=nl.sbuf)

    for rt in nl.static_range(r_tiles):
        r0 = rt * TILE_R
        pr = min(TILE_R, n_rows - r0)
        dr_col = drs[0:pr, rt:rt + 1]
        if resident:
            for k in nl.static_range(x_tiles):
                nisa.dma_copy(dst=brow[0:TILE_X, k * TILE_R:k * TILE_R + pr],
                              src=b_row[k * TILE_X:(k + 1) * TILE_X, r0:r0 + pr])
        for g in nl.static_range(n_groups):
            ct0 = g * COL_GROUP
            n_ct = min(COL_GROUP, c_tiles - ct0)
            acc = []
            for q in nl.static_range(n_ct):
                acc.append(nl.ndarray((TILE_R, TILE_C), dtype=nl.float32, buffer=nl.psum))
            for k in nl.static_range(x_tiles):
                if resident:
                    stationary = brow[0:TILE_X, k * TILE_R:k * TILE_R + pr]
                else:
                    st_tile = nl.ndarray((TILE_X, TILE_R), dtype=nl.float32, buffer=nl.sbuf)
                    nisa.dma_copy(dst=st_tile[0:TILE_X, 0:pr],
                                  src=b_row[k * TILE_X:(k + 1) * TILE_X, r0:r0 + pr])
                    stationary = st_tile[0:TILE_X, 0:pr]
                for q in nl.static_range(n_ct):
                    c0 = (ct0 + q) * TILE_C
                    wc = min(TILE_C, n_cols - c0)
                    if resident:
                        moving = bcol[0:TILE_X, k * n_cols + c0:k * n_cols + c0 + wc]
                    else:
                        mv_tile = nl.ndarray((TILE_X, TILE_C), dtype=nl.float32,
                                             buffer=nl.sbuf)
                        nisa.dma_copy(dst=mv_tile[0:TILE_X, 0:wc],
                                      src=b_col[k * TILE_X:(k + 1) * TILE_X, c0:c0 + wc])
                        moving = mv_tile[0:TILE_X, 0:wc]
                    nisa.nc_matmul(dst=acc[q][0:pr, 0:wc], stationary=stationary,
                                   moving=moving, accumulate=(k != 0))
            for q in nl.static_range(n_ct):
                c0 = (ct0 + q) * TILE_C
                wc = min(TILE_C, n_cols - c0)
                t_ps = acc[q][0:pr, 0:wc]
                reduce_direct_tile(t_ps, dcb, dr_col, part_sb, pr, wc, c0,
                                   rt * c_tiles + ct0 + q)

    nisa.dma_copy(dst=partials[0:TILE_R, 0:n_slots], src=part_sb[0:TILE_R, 0:n_slots])
    return partials
