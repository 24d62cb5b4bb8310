"""The reduction side shared by the four energy kernels: partial-sum outputs, denominators,
and the reduction of T tiles into per-partition partial sums.

Called from inside ``@nki.jit`` kernels (traced like their own body).
- ``open_partials`` / ``store_partials``: the (TILE, n_slots) fp32 partials, zeroed in SBUF,
  stored to the kernel's ``nl.shared_hbm`` output once at the end.
- ``column_denominators``: denom_col broadcast to every partition (K=1 ones matmuls);
  ``row_denominators``: denom_row as per-partition (P, 1) scalars.
- ``reduce_pair`` (same spin): given one pair block T_ij (nvir x nvir) resident in SBUF as row
  tiles of TILE partitions (row tile ``at`` at columns ``at*nvir .. (at+1)*nvir``), it forms per
  (TILE x TILE_N) tile the exchange partner T_ij^T with 128x128 Tensor Engine transposes into
  PSUM, scales T by 1/D on the Vector Engine (D = denom_row[a] + denom_col[b]) and reduces
  T^2/D and T*T^T/D along the free axis into two partial slots.
- ``reduce_direct_tile`` (opposite spin): T^2/D of one tile, in SBUF or PSUM, into one slot.
"""
import nki.isa as nisa
import nki.language as nl

from kernels.nki.tiling import broadcast_row, ones_row
from kernels.trn1 import TILE, TILE_N


def open_partials(n_slots):
    """(partials, part_sb): the kernel's (TILE, n_slots) HBM output and its zeroed SBUF copy."""
    partials = nl.ndarray((TILE, n_slots), dtype=nl.float32, buffer=nl.shared_hbm)
    part_sb = nl.ndarray((TILE, n_slots), dtype=nl.float32, buffer=nl.sbuf)
    nisa.memset(dst=part_sb, value=0.0)
    return partials, part_sb


def store_partials(partials, part_sb, n_slots):
    """The partial sums leave the chip: one DMA."""
    nisa.dma_copy(dst=partials[0:TILE, 0:n_slots], src=part_sb[0:TILE, 0:n_slots])


def column_denominators(denom_col, n_col_orb, nvir, b_tiles):
    """denom_col (n_col_orb, nvir) broadcast to every partition as dcb[p, j*nvir + b], exactly:
    one K=1 Tensor Engine matmul of a ones row per (orbital, TILE_N-column tile)."""
    ones = ones_row()
    dcb = nl.ndarray((TILE, n_col_orb * nvir), dtype=nl.float32, buffer=nl.sbuf)
    for j in nl.static_range(n_col_orb):
        for bt in nl.static_range(b_tiles):
            b0 = bt * TILE_N
            broadcast_row(dcb, j * nvir + b0, denom_col, j, b0, min(TILE_N, nvir - b0), ones)
    return dcb


def row_denominators(denom_row, n_row_orb, nvir, a_tiles):
    """denom_row ((n_row_orb*nvir), 1) as per-partition scalars: column i*a_tiles + at holds
    denom_row[(i, at*TILE + p)] on partition p."""
    drs = nl.ndarray((TILE, n_row_orb * a_tiles), dtype=nl.float32, buffer=nl.sbuf)
    for i in nl.static_range(n_row_orb):
        for at in nl.static_range(a_tiles):
            a0 = at * TILE
            pa = min(TILE, nvir - a0)
            col = i * a_tiles + at
            nisa.dma_copy(dst=drs[0:pa, col:col + 1],
                          src=denom_row[i * nvir + a0:i * nvir + a0 + pa, 0:1])
    return drs


def scaled_by_denominator(t_tile, dcb_cols, dr_col, rows, width):
    """A new (TILE, TILE_N) SBUF tile holding T / D in its (rows, width) corner, with
    D = dr_col (per partition) + dcb_cols (broadcast row): D, then 1/D, then T * (1/D), in
    place on the Vector Engine (there is no tensor-tensor divide)."""
    scaled = nl.ndarray((TILE, TILE_N), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_scalar(dst=scaled[0:rows, 0:width], data=dcb_cols, op0=nl.add, operand0=dr_col)
    nisa.reciprocal(dst=scaled[0:rows, 0:width], data=scaled[0:rows, 0:width])
    nisa.tensor_tensor(dst=scaled[0:rows, 0:width], data1=t_tile, data2=scaled[0:rows, 0:width],
                       op=nl.multiply)
    return scaled


def reduce_pair(t_sb, drs, dcb, part_sb, i, j, n_col_orb, nvir, a_tiles, b_tiles):
    """Add pair (i, j)'s direct and exchange partials into ``part_sb``: slot
    ``(((i*n_col_orb + j)*a_tiles + at)*b_tiles + bt)*2`` gets the direct sum of tile (at, bt),
    the next slot its exchange sum."""
    for at in nl.static_range(a_tiles):
        for bt in nl.static_range(b_tiles):
            slot = (((i * n_col_orb + j) * a_tiles + at) * b_tiles + bt) * 2
            reduce_pair_tile(t_sb, drs, dcb, part_sb, i, j, nvir, a_tiles, at, bt, slot)


def reduce_pair_tile(t_sb, drs, dcb, part_sb, i, j, nvir, a_tiles, at, bt, slot):
    """Tile (at, bt) of T_ij: its exchange partner by Tensor Engine transposes of the
    (TILE x TILE) blocks of T_ij that hold T_ij^T's rows a, then T^2/D and T T^T/D reduced along
    the free axis into partial slots ``slot`` and ``slot + 1``."""
    a0 = at * TILE
    pa = min(TILE, nvir - a0)
    b0 = bt * TILE_N
    wb = min(TILE_N, nvir - b0)
    partner = nl.ndarray((TILE, TILE_N), dtype=nl.float32, buffer=nl.psum)
    for sub in nl.static_range((wb + TILE - 1) // TILE):
        s0 = b0 + sub * TILE
        ps = min(TILE, nvir - s0)
        src_tile = s0 // TILE
        nisa.nc_transpose(dst=partner[0:pa, sub * TILE:sub * TILE + ps],
                          data=t_sb[0:ps, src_tile * nvir + a0:src_tile * nvir + a0 + pa])
    t_ab = t_sb[0:pa, at * nvir + b0:at * nvir + b0 + wb]
    dr_col = drs[0:pa, i * a_tiles + at:i * a_tiles + at + 1]
    scaled = scaled_by_denominator(t_ab, dcb[0:pa, j * nvir + b0:j * nvir + b0 + wb], dr_col,
                                   pa, wb)
    prod = nl.ndarray((TILE, TILE_N), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_tensor(dst=prod[0:pa, 0:wb], data1=scaled[0:pa, 0:wb], data2=t_ab,
                       op=nl.multiply)
    nisa.tensor_reduce(dst=part_sb[0:pa, slot:slot + 1], op=nl.add, data=prod[0:pa, 0:wb],
                       axis=1, keepdims=True)
    nisa.tensor_tensor(dst=prod[0:pa, 0:wb], data1=scaled[0:pa, 0:wb],
                       data2=partner[0:pa, 0:wb], op=nl.multiply)
    nisa.tensor_reduce(dst=part_sb[0:pa, slot + 1:slot + 2], op=nl.add, data=prod[0:pa, 0:wb],
                       axis=1, keepdims=True)


def reduce_direct_tile(t_tile, dcb, dr_col, part_sb, rows, width, c0, slot):
    """Opposite spin: add sum_c T^2 / D of one (rows x width) tile (in SBUF or PSUM) into
    partial column ``slot``; D = dr_col (per partition) + dcb[:, c0:c0 + width]."""
    scaled = scaled_by_denominator(t_tile, dcb[0:rows, c0:c0 + width], dr_col, rows, width)
    nisa.tensor_tensor(dst=scaled[0:rows, 0:width], data1=t_tile, data2=scaled[0:rows, 0:width],
                       op=nl.multiply)
    nisa.tensor_reduce(dst=part_sb[0:rows, slot:slot + 1], op=nl.add,
                       data=scaled[0:rows, 0:width], axis=1, keepdims=True)
