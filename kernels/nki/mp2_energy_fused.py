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
- ``diagonal_block`` (compile-time int): 1 when rows and columns are the same orbitals (a
  diagonal tile of the pair space): only pairs j <= i are computed; 0 computes every pair.
- ``resident`` (compile-time int, decided by the host): 1 keeps the b_row and b_col strips of
  one orbital in SBUF (one buffer each, reused), which needs (naux/128)*nvir*4 <=
  ENERGY_STRIP_BYTES bytes per partition; 0 streams their tiles from HBM at each use.
- returns ``partials`` (128, gr*gc*a_tiles*b_tiles*2) in ``nl.shared_hbm``: per-partition fp32
  partial sums. Column ``(((i*gc + j)*a_tiles + at)*b_tiles + bt)*2`` holds the direct sum of
  the (at, bt) tile of pair (i, j) row by row, the next column its exchange sum; rows beyond a
  ragged tile and skipped pairs hold 0. The host reduces partitions, tiles and pairs in fp64
  and applies the pair weights (2 for i > j in a diagonal block, 1 on the diagonal): the
  kernel only skips the pairs it must not compute.

Shape limits, asserted at trace time (the host is ``kernels/nki_host/mp2_energy.py``): naux a
multiple of TILE = 128 (zero rows contribute 0); any nvir (a-tiles of 128 rows with a ragged
last tile, b-tiles of TILE_N = 512 columns with a ragged last tile; tile sizes never come from
divisors of nvir); padded orbitals need zero B columns and finite denominators whose sums are
nonzero. SBUF per launch: the two resident strips (when ``resident``), T_ij (a_tiles*nvir*4 B),
the broadcast column denominators (gc*nvir*4 B) and the partials (n_slots*4 B) per partition.

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
import nki.isa as nisa
import nki.language as nl

from kernels.nki.pair_reduction import (column_denominators, open_partials, reduce_pair,
                                        row_denominators, store_partials)
from kernels.nki.tiling import accumulate_products, load_strip
from kernels.trn1 import ENERGY_STRIP_BYTES, FP32_BYTES, TILE, TILE_N


@nki.jit
def mp2_energy_fused_kernel(b_row, b_col, denom_row, denom_col, diagonal_block, resident):
    naux, row_cols = b_row.shape
    n_col_orb, nvir = denom_col.shape
    n_row_orb = row_cols // nvir
    assert naux % TILE == 0 and b_col.shape[0] == naux, (
        f"mp2_energy_fused_kernel: b_row {b_row.shape} and b_col {b_col.shape} need the same "
        f"naux, a multiple of {TILE}")
    assert row_cols % nvir == 0 and b_col.shape[1] == n_col_orb * nvir, (
        f"mp2_energy_fused_kernel: b_row {b_row.shape} / b_col {b_col.shape} are not whole "
        f"orbitals of {nvir} virtuals")
    assert denom_row.shape == (row_cols, 1), (
        f"mp2_energy_fused_kernel: denom_row {denom_row.shape} must be ({row_cols}, 1)")
    assert diagonal_block in (0, 1) and resident in (0, 1), (
        f"mp2_energy_fused_kernel: diagonal_block and resident must be 0 or 1, got "
        f"{diagonal_block} and {resident}")
    assert diagonal_block == 0 or n_row_orb == n_col_orb, (
        f"mp2_energy_fused_kernel: a diagonal block needs as many row as column orbitals, got "
        f"{n_row_orb} x {n_col_orb}")
    x_tiles = naux // TILE
    assert resident == 0 or x_tiles * nvir * FP32_BYTES <= ENERGY_STRIP_BYTES, (
        f"mp2_energy_fused_kernel: resident strips of {naux} x {nvir} exceed "
        f"{ENERGY_STRIP_BYTES} B per partition")
    a_tiles = (nvir + TILE - 1) // TILE
    b_tiles = (nvir + TILE_N - 1) // TILE_N
    n_slots = n_row_orb * n_col_orb * a_tiles * b_tiles * 2

    partials, part_sb = open_partials(n_slots)
    dcb = column_denominators(denom_col, n_col_orb, nvir, b_tiles)
    drs = row_denominators(denom_row, n_row_orb, nvir, a_tiles)

    brow = None
    bcol = None
    if resident == 1:
        # one buffer each, reused by every orbital / pair (no double buffering of the big strips)
        brow = nl.ndarray((TILE, x_tiles * nvir), dtype=nl.float32, buffer=nl.sbuf)
        bcol = nl.ndarray((TILE, x_tiles * nvir), dtype=nl.float32, buffer=nl.sbuf)
    for i in nl.static_range(n_row_orb):
        if resident == 1:
            load_strip(brow, b_row, x_tiles, nvir, i * nvir, nvir)
        for j in nl.static_range(n_col_orb):
            if diagonal_block == 0 or j <= i:
                if resident == 1:
                    load_strip(bcol, b_col, x_tiles, nvir, j * nvir, nvir)
                # T_ij in SBUF: row tile at occupies columns at*nvir .. (at+1)*nvir.
                t_sb = nl.ndarray((TILE, a_tiles * nvir), dtype=nl.float32, buffer=nl.sbuf)
                for at in nl.static_range(a_tiles):
                    form_t_row_tile(t_sb, at, i, j, nvir, x_tiles, resident, brow, bcol, b_row,
                                    b_col)
                reduce_pair(t_sb, drs, dcb, part_sb, i, j, n_col_orb, nvir, a_tiles, b_tiles)

    store_partials(partials, part_sb, n_slots)
    return partials


def form_t_row_tile(t_sb, at, i, j, nvir, x_tiles, resident, brow, bcol, b_row, b_col):
    """Row tile ``at`` of T_ij = b_row[:, i]^T b_col[:, j] into t_sb: its TILE_N-wide tiles
    accumulate over the x_tiles auxiliary tiles in PSUM, then move to SBUF (Vector Engine)."""
    a0 = at * TILE
    pa = min(TILE, nvir - a0)
    acc = accumulate_products(x_tiles, pa,
                              resident, brow, nvir, a0, b_row, i * nvir + a0,
                              resident, bcol, nvir, 0, b_col, j * nvir, nvir)
    for bt in nl.static_range(len(acc)):
        b0 = bt * TILE_N
        wb = min(TILE_N, nvir - b0)
        nisa.tensor_copy(dst=t_sb[0:pa, at * nvir + b0:at * nvir + b0 + wb],
                         src=acc[bt][0:pa, 0:wb])
