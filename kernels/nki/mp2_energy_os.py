"""NKI kernel: opposite-spin (alpha-beta) DF-MP2 energy from a block T already in HBM ("plain").

For a block of alpha rows r = (i, a) and beta columns c = (j, b), T[r, c] = (ia|jb):

    direct += sum_rc T[r, c]^2 / (denom_row[r] + denom_col[c])

No exchange term (the alpha and beta virtual spaces differ), no pair symmetry, and a separable
denominator: the kernel treats T as one flat (rows x cols) matrix and never needs nvir_row,
nvir_col or the orbital counts (see ``mp2_energy_os_fused``, which forms T on chip instead).

Operands (all fp32, HBM):
- ``t`` (n_rows, n_cols): rows (i, a), columns (j, b), orbital-major.
- ``denom_row`` (n_rows, 1): e_i - e_a, one value per partition row of a tile.
- ``denom_col`` (1, n_cols): e_j - e_b.
- returns ``partials`` (128, r_tiles*c_tiles) in ``nl.shared_hbm``, laid out exactly as in
  ``mp2_energy_os_fused``: column ``rt*c_tiles + ct`` holds the per-partition direct sum of
  tile (rt, ct) (128 rows x 512 columns, ragged last tiles); unused rows hold 0.

Shape limits: any n_rows and n_cols (ragged last tiles); padded rows / columns need zero T and
finite denominators with nonzero sums. SBUF: one (128, n_cols) strip of T per row tile
(n_cols*4 bytes per partition), the broadcast column denominators (n_cols*4 B) and the
partials; the host keeps n_cols <= 2048.

Trainium features used:
- DMA: each 128-row strip of T is read from HBM once, in one transfer, into SBUF.
- Tensor Engine: a K=1 matmul against a ones row broadcasts the column denominators to every
  partition once per launch (exact in fp32).
- Vector Engine per (128 x 512) tile: D (``tensor_scalar`` add with the per-partition (P, 1)
  row denominators), 1/D (``reciprocal``), T/D and T^2/D (``tensor_tensor``) and one
  free-axis ``tensor_reduce`` into per-partition partials. No partition-axis reductions.
- Engines side by side: DMA loads the next T strip while the Vector Engine reduces this one.
"""
import nki
import nki.language as nl
import nki.isa as nisa

from kernels.nki.pair_reduction import (column_denominators, reduce_direct_tile,
                                        row_denominators)

TILE_R = 128  # rows (i, a) of a T tile (partition dim); = pair_reduction.TILE_A
TILE_C = 512  # columns (j, b) of a T tile (one fp32 PSUM bank); = pair_reduction.TILE_B


@nki.jit
def mp2_energy_os_kernel(t, denom_row, denom_col):
    n_rows, n_cols = t.shape
    r_tiles = (n_rows + TILE_R - 1) // TILE_R
    c_tiles = (n_cols + TILE_C - 1) // TILE_C
    n_slots = r_tiles * c_tiles

    partials = nl.ndarray((TILE_R, n_slots), dtype=nl.float32, buffer=nl.shared_hbm)
    part_sb = nl.ndarray((TILE_R, n_slots), dtype=nl.float32, buffer=nl.sbuf)
    nisa.memset(dst=part_sb, value=0.0)

    # One 'orbital' spanning all rows and columns: dcb[p, c] = denom_col[0, c] on every
    # partition, and column rt of drs holds denom_row[rt*128 + p] on partition p.
    dcb = column_denominators(denom_col, 1, n_cols, c_tiles)
    drs = row_denominators(denom_row, 1, n_rows, r_tiles)

    for rt in nl.static_range(r_tiles):
        r0 = rt * TILE_R
        pr = min(TILE_R, n_rows - r0)
        dr_col = drs[0:pr, rt:rt + 1]
        t_sb = nl.ndarray((TILE_R, n_cols), dtype=nl.float32, buffer=nl.sbuf)
        nisa.dma_copy(dst=t_sb[0:pr, 0:n_cols], src=t[r0:r0 + pr, 0:n_cols])
        for ct in nl.static_range(c_tiles):
            c0 = ct * TILE_C
            wc = min(TILE_C, n_cols - c0)
            t_rc = t_sb[0:pr, c0:c0 + wc]
            reduce_direct_tile(t_rc, dcb, dr_col, part_sb, pr, wc, c0,
                               rt * c_tiles + ct)

    nisa.dma_copy(dst=partials[0:TILE_R, 0:n_slots], src=part_sb[0:TILE_R, 0:n_slots])
    return partials
