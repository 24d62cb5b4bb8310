"""NKI kernel: DF-MP2 pair energies from a block T of (ia|jb) already in HBM ("plain").

For every occupied pair (i, j) of the launch, with T_ij[a, b] = t[(i, a), (j, b)]:

    D[a, b]    = denom_row[(i, a)] + denom_col[(j, b)]
    direct    += sum_ab T_ij[a, b]^2            / D[a, b]
    exchange  += sum_ab T_ij[a, b] T_ij[b, a]   / D[a, b]

Operands (all fp32, HBM):
- ``t`` (gr*nvir, gc*nvir): rows (i, a), columns (j, b), orbital-major.
- ``denom_row`` (gr*nvir, 1): e_i - e_a for the row orbitals, one value per partition row.
- ``denom_col`` (gc, nvir): e_j - e_b for the column orbitals; gives nvir and gc.
- ``diagonal_block`` (compile-time int): 1 when rows and columns are the same orbitals (a
  diagonal tile of the pair space): only pairs j <= i are computed; 0 computes every pair.
- returns ``partials`` (128, gr*gc*a_tiles*b_tiles*2) in ``nl.shared_hbm``, laid out exactly as
  in ``mp2_energy_fused``: column ``(((i*gc + j)*a_tiles + at)*b_tiles + bt)*2`` holds the
  per-partition direct sum of tile (at, bt) of pair (i, j), the next column its exchange sum;
  unused rows and skipped pairs hold 0. The host sums in fp64 and applies the pair weights.

Shape limits, asserted at trace time (the host is ``kernels/nki_host/mp2_energy.py``): any
nvir (a-tiles of TILE = 128 rows and b-tiles of TILE_N = 512 columns, both with a ragged last
tile; never divisors of nvir); t (gr*nvir, gc*nvir) for gc = denom_col.shape[0] and gr =
gc when ``diagonal_block``; padded orbitals need zero T rows / columns and finite denominators
with nonzero sums. SBUF per pair: T_ij (a_tiles * nvir * 4 bytes per partition).

Trainium features used:
- DMA: each pair block T_ij is read from HBM once, row tile by row tile, into SBUF.
- Tensor Engine: ``nisa.nc_transpose`` of 128x128 blocks of the SBUF copy gives the exchange
  partner T_ij^T in PSUM (no second HBM read, no strided DMA); a K=1 matmul against a ones row
  broadcasts the column denominators to every partition once per launch (exact in fp32).
- Vector Engine: denominator add (``tensor_scalar`` with a per-partition (P, 1) operand),
  ``reciprocal``, products (``tensor_tensor``, the partner operand read straight from PSUM),
  free-axis ``tensor_reduce`` into per-partition partials. No partition-axis reductions.
- Engines side by side: DMA loads the next pair while the Tensor Engine transposes and the
  Vector Engine reduces the current one.
"""
import nki
import nki.isa as nisa
import nki.language as nl

from kernels.nki.pair_reduction import (column_denominators, open_partials, reduce_pair,
                                        row_denominators, store_partials)
from kernels.trn1 import TILE, TILE_N


@nki.jit
def mp2_energy_kernel(t, denom_row, denom_col, diagonal_block):
    row_size, col_size = t.shape
    n_col_orb, nvir = denom_col.shape
    n_row_orb = row_size // nvir
    assert row_size % nvir == 0 and col_size == n_col_orb * nvir, (
        f"mp2_energy_kernel: t {t.shape} is not whole orbitals of {nvir} virtuals x "
        f"{n_col_orb} column orbitals")
    assert denom_row.shape == (row_size, 1), (
        f"mp2_energy_kernel: denom_row {denom_row.shape} must be ({row_size}, 1)")
    assert diagonal_block in (0, 1), (
        f"mp2_energy_kernel: diagonal_block must be 0 or 1, got {diagonal_block}")
    assert diagonal_block == 0 or n_row_orb == n_col_orb, (
        f"mp2_energy_kernel: a diagonal block needs as many row as column orbitals, got "
        f"{n_row_orb} x {n_col_orb}")
    a_tiles = (nvir + TILE - 1) // TILE
    b_tiles = (nvir + TILE_N - 1) // TILE_N
    n_slots = n_row_orb * n_col_orb * a_tiles * b_tiles * 2

    partials, part_sb = open_partials(n_slots)
    dcb = column_denominators(denom_col, n_col_orb, nvir, b_tiles)
    drs = row_denominators(denom_row, n_row_orb, nvir, a_tiles)

    for i in nl.static_range(n_row_orb):
        for j in nl.static_range(n_col_orb):
            if diagonal_block == 0 or j <= i:
                # T_ij in SBUF: row tile at occupies columns at*nvir .. (at+1)*nvir, one DMA each
                t_sb = nl.ndarray((TILE, a_tiles * nvir), dtype=nl.float32, buffer=nl.sbuf)
                for at in nl.static_range(a_tiles):
                    a0 = at * TILE
                    pa = min(TILE, nvir - a0)
                    nisa.dma_copy(dst=t_sb[0:pa, at * nvir:(at + 1) * nvir],
                                  src=t[i * nvir + a0:i * nvir + a0 + pa,
                                        j * nvir:(j + 1) * nvir])
                reduce_pair(t_sb, drs, dcb, part_sb, i, j, n_col_orb, nvir, a_tiles, b_tiles)

    store_partials(partials, part_sb, n_slots)
    return partials
