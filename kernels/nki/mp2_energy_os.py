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

Shape limits, asserted at trace time (the host is ``kernels/nki_host/mp2_energy_os.py``): any
n_rows; n_cols <= OS_MAX_COLS (2048) (ragged last tiles); padded rows / columns need zero T and
finite denominators with nonzero sums. SBUF: one (128, n_cols) strip of T per row tile
(n_cols*4 bytes per partition), the broadcast column denominators (n_cols*4 B) and the
partials.

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
import nki.isa as nisa
import nki.language as nl

from kernels.nki.pair_reduction import (column_denominators, open_partials, reduce_direct_tile,
                                        row_denominators, store_partials)
from kernels.trn1 import OS_MAX_COLS, TILE, TILE_N


@nki.jit
def mp2_energy_os_kernel(t, denom_row, denom_col):
    n_rows, n_cols = t.shape
    assert denom_row.shape == (n_rows, 1) and denom_col.shape == (1, n_cols), (
        f"mp2_energy_os_kernel: denom_row {denom_row.shape} and denom_col {denom_col.shape} "
        f"must be ({n_rows}, 1) and (1, {n_cols})")
    assert n_cols <= OS_MAX_COLS, f"mp2_energy_os_kernel: {n_cols} columns exceed {OS_MAX_COLS}"
    r_tiles = (n_rows + TILE - 1) // TILE
    c_tiles = (n_cols + TILE_N - 1) // TILE_N
    n_slots = r_tiles * c_tiles

    partials, part_sb = open_partials(n_slots)
    # One 'orbital' spanning all rows and columns: dcb[p, c] = denom_col[0, c] on every
    # partition, and column rt of drs holds denom_row[rt*128 + p] on partition p.
    dcb = column_denominators(denom_col, 1, n_cols, c_tiles)
    drs = row_denominators(denom_row, 1, n_rows, r_tiles)

    for rt in nl.static_range(r_tiles):
        r0 = rt * TILE
        pr = min(TILE, n_rows - r0)
        t_sb = nl.ndarray((TILE, n_cols), dtype=nl.float32, buffer=nl.sbuf)
        nisa.dma_copy(dst=t_sb[0:pr, 0:n_cols], src=t[r0:r0 + pr, 0:n_cols])
        for ct in nl.static_range(c_tiles):
            c0 = ct * TILE_N
            wc = min(TILE_N, n_cols - c0)
            reduce_direct_tile(t_sb[0:pr, c0:c0 + wc], dcb, drs[0:pr, rt:rt + 1], part_sb, pr,
                               wc, c0, rt * c_tiles + ct)

    store_partials(partials, part_sb, n_slots)
    return partials
