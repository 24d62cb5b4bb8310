"""NKI kernel: fused DF-MP2 pair energies; (ia|jb) tiles are formed in PSUM and never leave chip.

For every occupied pair (i, j) of the launch:

    T_ij[a, b] = sum_Q b_row[Q, (i, a)] b_col[Q, (j, b)]          (Tensor Engine, PSUM)
    D[a, b]    = denom_row[(i, a)] + denom_col[(j, b)]
    direct    += sum_ab T_ij[a, b]^2            / D[a, b]
    exchange  += sum_ab T_ij[a, b] T_ij[b, a]   / D[a, b]

Operands (all fp32, HBM):
- ``b_row`` (naux, gr*nvir) and ``b_col`` (naux, gc*nvir): fitted DF blocks, the auxiliary
  index on the partition axis (the natural stationary / moving layout), columns (orbital,
  virtual) orbital-major.
- ``denom_row`` (gr*nvir, 1): e_i - e_a for the row orbitals, one value per partition row.
- ``denom_col`` (gc, nvir): e_j - e_b for the column orbitals; gives nvir and gc.
- ``lower_pairs`` (compile-time int): 1 computes only pairs j <= i (a diagonal tile of the
  pair space), 0 computes every pair.
- returns ``partials`` (128, gr*gc*a_tiles*b_tiles*2) in ``nl.shared_hbm``: per-partition fp32
  partial sums. Column ``(((i*gc + j)*a_tiles + at)*b_tiles + bt)*2`` holds the direct sum of
  the (at, bt) tile of pair (i, j) row by row, the next column its exchange sum; rows beyond a
  ragged tile and skipped pairs hold 0. The host reduces partitions, tiles and pairs in fp64
  and applies the pair weights (2 for i > j in a lower_pairs block, 1 on the diagonal): the
  kernel only skips the pairs it must not compute.

Shape limits: naux a multiple of 128 (zero rows contribute 0); any nvir (a-tiles of 128 rows
with a ragged last tile, b-tiles of 512 columns with a ragged last tile; tile sizes never come
from divisors of nvir); padded orbitals need zero B columns and finite denominators whose sums
are nonzero. SBUF: the b_row and b_col strips of one orbital stay resident (one buffer each,
reused) when (naux/128)*nvir*4 <= STRIP_BYTES bytes per partition, else their tiles are streamed
from HBM per use. The rest per launch: T_ij (a_tiles*nvir*4 B), the broadcast column
denominators (gc*nvir*4 B) and the partials (n_slots*4 B) per partition.

Trainium features used:
- PSUM accumulation over the naux/128 tiles of each (a-tile, b-tile) of T_ij with explicit
  ``accumulate=(k != 0)``; stationary reuse: one 128 x a-tile stationary per k serves all the
  b-tiles of that row tile back to back.
- SBUF residency: the b_row strip of orbital i is loaded once per i, the b_col strip of j once
  per pair, the column denominators once per launch; T_ij lives only in PSUM and SBUF and is
  never written to HBM. Only the (128, n_slots) partials leave the chip.
- Tensor Engine transposes (``nisa.nc_transpose``, 128x128 blocks) give the exchange partner
  T_ij^T from the SBUF copy of T_ij; the column denominators are broadcast to all partitions
  by a K=1 matmul against a ones row (exact in fp32).
- Vector Engine: denominator add (``tensor_scalar`` with a per-partition (P, 1) operand),
  ``reciprocal``, products (``tensor_tensor``, one operand may stay in PSUM) and free-axis
  ``tensor_reduce`` into per-partition partials. No partition-axis reductions.
- Engines side by side: DMA streams the next b_col strip while the Tensor Engine forms T tiles
  and the Vector Engine reduces the previous ones.
"""
import nki
import nki.language as nl
import nki.isa as nisa

from kernels.nki.pair_reduction import (TILE_A, TILE_B, column_denominators, reduce_pair,
                                        row_denominators)

TILE_X = 128  # auxiliary rows per matmul (contraction, partition dim)
STRIP_BYTES = 49152  # per-partition SBUF budget of one resident b strip (48 KiB)


@nki.jit
def mp2_energy_fused_kernel(b_row, b_col, denom_row, denom_col, lower_pairs):
    naux, row_cols = b_row.shape
    n_col_orb, nvir = denom_col.shape
    n_row_orb = row_cols // nvir
    x_tiles = naux // TILE_X
    a_tiles = (nvir + TILE_A - 1) // TILE_A
    b_tiles = (nvir + TILE_B - 1) // TILE_B
    n_slots = n_row_orb * n_col_orb * a_tiles * b_tiles * 2
    resident = x_tiles * nvir * 4 <= STRIP_BYTES

    partials = nl.ndarray((TILE_A, n_slots), dtype=nl.float32, buffer=nl.shared_hbm)
    part_sb = nl.ndarray((TILE_A, n_slots), dtype=nl.float32, buffer=nl.sbuf)
    nisa.memset(dst=part_sb, value=0.0)

    dcb = column_denominators(denom_col, n_col_orb, nvir, b_tiles)
    drs = row_denominators(denom_row, n_row_orb, nvir, a_tiles)

    if resident:
        # one buffer each, reused by every orbital / pair (no double buffering of the big strips)
        brow = nl.ndarray((TILE_X, x_tiles * nvir), dtype=nl.float32, buffer=nl.sbuf)
        bcol = nl.ndarray((TILE_X, x_tiles * nvir), dtype=nl.float32, buffer=nl.sbuf)
    for i in nl.static_range(n_row_orb):
        if resident:
            for k in nl.static_range(x_tiles):
                nisa.dma_copy(dst=brow[0:TILE_X, k * nvir:(k + 1) * nvir],
                              src=b_row[k * TILE_X:(k + 1) * TILE_X, i * nvir:(i + 1) * nvir])
        for j in nl.static_range(n_col_orb):
            if lower_pairs == 0 or j <= i:
                if resident:
                    for k in nl.static_range(x_tiles):
                        nisa.dma_copy(dst=bcol[0:TILE_X, k * nvir:(k + 1) * nvir],
                                      src=b_col[k * TILE_X:(k + 1) * TILE_X,
                                                j * nvir:(j + 1) * nvir])

                # T_ij in SBUF: row tile at occupies columns at*nvir .. (at+1)*nvir.
                t_sb = nl.ndarray((TILE_A, a_tiles * nvir), dtype=nl.float32, buffer=nl.sbuf)
                for at in nl.static_range(a_tiles):
                    a0 = at * TILE_A
                    pa = min(TILE_A, nvir - a0)
                    acc = []
                    for bt in nl.static_range(b_tiles):
                        acc.append(nl.ndarray((TILE_A, TILE_B), dtype=nl.float32, buffer=nl.psum))
                    for k in nl.static_range(x_tiles):
                        if resident:
                            stationary = brow[0:TILE_X, k * nvir + a0:k * nvir + a0 + pa]
                        else:
                            st_tile = nl.ndarray((TILE_X, TILE_A), dtype=nl.float32,
                                                 buffer=nl.sbuf)
                            nisa.dma_copy(dst=st_tile[0:TILE_X, 0:pa],
                                          src=b_row[k * TILE_X:(k + 1) * TILE_X,
                                                    i * nvir + a0:i * nvir + a0 + pa])
                            stationary = st_tile[0:TILE_X, 0:pa]
                        for bt in nl.static_range(b_tiles):
                            b0 = bt * TILE_B
                            wb = min(TILE_B, nvir - b0)
                            if resident:
                                moving = bcol[0:TILE_X, k * nvir + b0:k * nvir + b0 + wb]
                            else:
                                mv_tile = nl.ndarray((TILE_X, TILE_B), dtype=nl.float32,
                                                     buffer=nl.sbuf)
                                nisa.dma_copy(dst=mv_tile[0:TILE_X, 0:wb],
                                              src=b_col[k * TILE_X:(k + 1) * TILE_X,
                                                        j * nvir + b0:j * nvir + b0 + wb])
                                moving = mv_tile[0:TILE_X, 0:wb]
                            nisa.nc_matmul(dst=acc[bt][0:pa, 0:wb], stationary=stationary,
                                           moving=moving, accumulate=(k != 0))
                    for bt in nl.static_range(b_tiles):
                        b0 = bt * TILE_B
                        wb = min(TILE_B, nvir - b0)
                        nisa.tensor_copy(dst=t_sb[0:pa, at * nvir + b0:at * nvir + b0 + wb],
                                         src=acc[bt][0:pa, 0:wb])

                reduce_pair(t_sb, drs, dcb, part_sb, i, j, n_col_orb, nvir, a_tiles, b_tiles)

    nisa.dma_copy(dst=partials[0:TILE_A, 0:n_slots], src=part_sb[0:TILE_A, 0:n_slots])
    return partials
