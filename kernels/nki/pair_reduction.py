"""The per-pair reduction shared by the plain and fused same-spin energy kernels.

Called from inside ``@nki.jit`` kernels (traced like their own body). Given one pair block T_ij
(nvir x nvir) resident in SBUF as row tiles of TILE_A partitions (row tile ``at`` occupies
columns ``at*nvir .. (at+1)*nvir``), it forms, per (TILE_A x TILE_B) tile, the exchange partner
T_ij^T with 128x128 Tensor Engine transposes into PSUM, scales T by 1/D on the Vector Engine
(D = denom_row[a] + denom_col[b]: a (P, 1) per-partition scalar plus a partition-broadcast
row), and reduces T^2/D and T*T^T/D along the free axis into two per-partition partial slots.
"""
import nki.language as nl
import nki.isa as nisa

TILE_A = 128  # rows a of a T tile (partition dim); also the transpose block
TILE_B = 512  # columns b of a T tile (one fp32 PSUM bank for the transposed partner)


def column_denominators(denom_col, n_col_orb, nvir, b_tiles):
    """denom_col (n_col_orb, nvir) broadcast to every partition as dcb[p, j*nvir + b], exactly:
    a K=1 Tensor Engine matmul of a ones row against each row strip."""
    ones_row = nl.ndarray((1, TILE_A), dtype=nl.float32, buffer=nl.sbuf)
    nisa.memset(dst=ones_row, value=1.0)
    dcb = nl.ndarray((TILE_A, n_col_orb * nvir), dtype=nl.float32, buffer=nl.sbuf)
    for j in nl.static_range(n_col_orb):
        for bt in nl.static_range(b_tiles):
            b0 = bt * TILE_B
            wb = min(TILE_B, nvir - b0)
            dc_row = nl.ndarray((1, TILE_B), dtype=nl.float32, buffer=nl.sbuf)
            nisa.dma_copy(dst=dc_row[0:1, 0:wb], src=denom_col[j:j + 1, b0:b0 + wb])
            bcast = nl.ndarray((TILE_A, TILE_B), dtype=nl.float32, buffer=nl.psum)
            nisa.nc_matmul(dst=bcast[0:TILE_A, 0:wb], stationary=ones_row,
                           moving=dc_row[0:1, 0:wb], accumulate=False)
            nisa.tensor_copy(dst=dcb[0:TILE_A, j * nvir + b0:j * nvir + b0 + wb],
                             src=bcast[0:TILE_A, 0:wb])
    return dcb


def row_denominators(denom_row, n_row_orb, nvir, a_tiles):
    """denom_row ((n_row_orb*nvir), 1) as per-partition scalars: column i*a_tiles + at holds
    denom_row[(i, at*128 + p)] on partition p."""
    drs = nl.ndarray((TILE_A, n_row_orb * a_tiles), dtype=nl.float32, buffer=nl.sbuf)
    for i in nl.static_range(n_row_orb):
        for at in nl.static_range(a_tiles):
            a0 = at * TILE_A
            pa = min(TILE_A, nvir - a0)
            col = i * a_tiles + at
            nisa.dma_copy(dst=drs[0:pa, col:col + 1],
                          src=denom_row[i * nvir + a0:i * nvir + a0 + pa, 0:1])
    return drs


def reduce_pair(t_sb, drs, dcb, part_sb, i, j, n_col_orb, nvir, a_tiles, b_tiles):
    """Add pair (i, j)'s direct and exchange partials into ``part_sb`` (TILE_A, slots)."""
    for at in nl.static_range(a_tiles):
        a0 = at * TILE_A
        pa = min(TILE_A, nvir - a0)
        dr_col = drs[0:pa, i * a_tiles + at:i * a_tiles + at + 1]
        for bt in nl.static_range(b_tiles):
            b0 = bt * TILE_B
            wb = min(TILE_B, nvir - b0)
            partner = nl.ndarray((TILE_A, TILE_B), dtype=nl.float32, buffer=nl.psum)
            for sub in nl.static_range((wb + TILE_A - 1) // TILE_A):
                s0 = b0 + sub * TILE_A
                ps = min(TILE_A, nvir - s0)
                src_tile = s0 // TILE_A
                nisa.nc_transpose(
                    dst=partner[0:pa, sub * TILE_A:sub * TILE_A + ps],
                    data=t_sb[0:ps, src_tile * nvir + a0:src_tile * nvir + a0 + pa])
            t_ab = t_sb[0:pa, at * nvir + b0:at * nvir + b0 + wb]
            # scaled = T / D, built in place: D, then 1/D, then T * (1/D)
            scaled = nl.ndarray((TILE_A, TILE_B), dtype=nl.float32, buffer=nl.sbuf)
            nisa.tensor_scalar(dst=scaled[0:pa, 0:wb],
                               data=dcb[0:pa, j * nvir + b0:j * nvir + b0 + wb],
                               op0=nl.add, operand0=dr_col)
            nisa.reciprocal(dst=scaled[0:pa, 0:wb], data=scaled[0:pa, 0:wb])
            nisa.tensor_tensor(dst=scaled[0:pa, 0:wb], data1=t_ab, data2=scaled[0:pa, 0:wb],
                               op=nl.multiply)
            slot = (((i * n_col_orb + j) * a_tiles + at) * b_tiles + bt) * 2
            prod = nl.ndarray((TILE_A, TILE_B), dtype=nl.float32, buffer=nl.sbuf)
            nisa.tensor_tensor(dst=prod[0:pa, 0:wb], data1=scaled[0:pa, 0:wb], data2=t_ab,
                               op=nl.multiply)
            nisa.tensor_reduce(dst=part_sb[0:pa, slot:slot + 1], op=nl.add,
                               data=prod[0:pa, 0:wb], axis=1, keepdims=True)
            nisa.tensor_tensor(dst=prod[0:pa, 0:wb], data1=scaled[0:pa, 0:wb],
                               data2=partner[0:pa, 0:wb], op=nl.multiply)
            nisa.tensor_reduce(dst=part_sb[0:pa, slot + 1:slot + 2], op=nl.add,
                               data=prod[0:pa, 0:wb], axis=1, keepdims=True)


def reduce_direct_tile(t_tile, dcb, dr_col, part_sb, pr, wc, c0, slot):
    """Opposite spin: add sum_b T^2 / D of one (pr x wc) tile (in SBUF or PSUM) into partial
    column ``slot``; D = dr_col (per partition) + dcb[:, c0:c0 + wc] (broadcast row)."""
    scaled = nl.ndarray((TILE_A, TILE_B), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_scalar(dst=scaled[0:pr, 0:wc], data=dcb[0:pr, c0:c0 + wc], op0=nl.add,
                       operand0=dr_col)
    nisa.reciprocal(dst=scaled[0:pr, 0:wc], data=scaled[0:pr, 0:wc])
    nisa.tensor_tensor(dst=scaled[0:pr, 0:wc], data1=t_tile, data2=scaled[0:pr, 0:wc],
                       op=nl.multiply)
    nisa.tensor_tensor(dst=scaled[0:pr, 0:wc], data1=t_tile, data2=scaled[0:pr, 0:wc],
                       op=nl.multiply)
    nisa.tensor_reduce(dst=part_sb[0:pr, slot:slot + 1], op=nl.add, data=scaled[0:pr, 0:wc],
                       axis=1, keepdims=True)
