"""Memory plan: where B lives and how many occupied orbitals go in one energy block."""
from __future__ import annotations

from dataclasses import dataclass

from dfmp2.errors import InputError
from dfmp2.system.distributed import DIAGONAL_COST, deal_pairs
from dfmp2.system.memory import B_IN_MEMORY_SHARE, FP64_BYTES, fits_in_memory, format_size

# Temporaries of the energy reduction, in units of one orbital row (nvir x nj x nvir numbers).
REDUCTION_TEMPORARIES = 4
# A larger (ia|jb) block no longer speeds up the GEMM; it only costs memory.
MAX_PAIR_BLOCK_BYTES = 256 * 2**20
# Blocks of B held at once out of core: the row block, the column block and the one prefetched.
OUT_OF_CORE_BLOCKS = 3
# Integral blocks beyond this size make no build step faster, only the peak memory higher.
MAX_BUILD_BLOCK_BYTES = 512 * 2**20
# On several ranks, the blocks are made smaller (up to twice as many) until the largest
# rank's share of the block pairs is within this fraction of the mean: every rank waits for
# the slowest at the end.
# (H2O)16's 80 orbitals in 5 blocks deal out 6.5 : 6 over 2 ranks (8% idle), in 6 blocks
# within 0.3%.
BALANCE_TOLERANCE = 0.02


@dataclass(frozen=True)
class BlockPlan:
    """How the MP2 stage runs: occupied orbitals per energy block, whether B lives out of core,
    the fused or plain energy kernel, and the memory each part may use."""

    occ_block: int
    nblocks: int
    out_of_core: bool
    fused: bool
    b_bytes: int
    energy_bytes: int
    build_block_bytes: int
    budget: int


def energy_block_bytes(occ_block: int, nvir: int, naux: int, itemsize: int, fused: bool,
                       out_of_core: bool) -> int:
    """Peak bytes the energy step allocates for blocks of ``occ_block`` occupied orbitals."""
    reduction = REDUCTION_TEMPORARIES * nvir * occ_block * nvir * itemsize
    if fused:
        pair_work = max(nvir, 512) * occ_block * nvir * itemsize
    else:
        pair_work = (occ_block * nvir) ** 2 * itemsize
    streamed = (OUT_OF_CORE_BLOCKS * naux * occ_block * nvir * (itemsize + FP64_BYTES)
                if out_of_core else 0)
    return pair_work + reduction + streamed


def dealt_imbalance(nocc: int, occ_block: int, ranks: int) -> float:
    """The largest rank's share of the block pairs I <= J over the mean share, dealt as the
    energy step deals them (diagonal pairs at DIAGONAL_COST)."""
    blocks = [min(occ_block, nocc - i0) for i0 in range(0, nocc, occ_block)]
    pairs = [(n, m) for n in range(len(blocks)) for m in range(n, len(blocks))]

    def cost(pair: tuple[int, int]) -> float:
        n, m = pair
        return blocks[n] * blocks[m] * (DIAGONAL_COST if n == m else 1.0)

    loads = [sum(cost(pair) for pair in batch) for batch in deal_pairs(pairs, cost, ranks)]
    return max(loads) * ranks / sum(loads)


def _balanced_block(nocc: int, fewest: int, ranks: int) -> int:
    """The largest even block, from ``fewest`` blocks up to twice as many, whose pairs deal
    out within BALANCE_TOLERANCE over ``ranks``; else the best dealt of them (more blocks
    than that only add pairs, each with its own round and checkpoint)."""
    candidates = sorted({-(-nocc // nblocks) for nblocks in range(fewest, 2 * fewest + 1)},
                        reverse=True)
    for occ_block in candidates:
        if dealt_imbalance(nocc, occ_block, ranks) <= 1.0 + BALANCE_TOLERANCE:
            return occ_block
    return min(candidates, key=lambda block: (dealt_imbalance(nocc, block, ranks), -block))


def plan_blocks(sizes: list[tuple[int, int]], naux: int, nao: int, itemsize: int, budget: int,
                fused: bool, requested: int | None = None,
                force_out_of_core: bool = False, min_pairs: int = 1,
                ranks: int = 1) -> BlockPlan:
    """Keep B (one per spin channel, ``sizes`` = [(nocc, nvir), ...]) in memory when it fits
    comfortably, else stream it from scratch; then take the fewest occupied blocks, of even
    size, that fit what is left and still give at least ``min_pairs`` block pairs I <= J (work
    for every rank of a distributed run) and, on several ``ranks``, deal out evenly."""
    nocc = max(o for o, _ in sizes)
    nvir = max(v for _, v in sizes)
    b_bytes = naux * sum(o * v for o, v in sizes) * (
        FP64_BYTES + (itemsize if itemsize != FP64_BYTES else 0))
    out_of_core = force_out_of_core or not fits_in_memory(b_bytes, budget, B_IN_MEMORY_SHARE)
    resident = 0 if out_of_core else b_bytes
    build_minimum = FP64_BYTES * (nao * (nao + 1) // 2 + nao * nao + nao * nocc + nocc * nvir
                                  + 2 * naux)
    minimum = resident + max(build_minimum,
                             energy_block_bytes(1, nvir, naux, itemsize, fused, out_of_core))
    if budget < minimum:
        raise InputError(f"memory budget {format_size(budget)} is too small for this molecule: "
                         f"at least {format_size(minimum, rounded_up=True)} is needed; "
                         "raise --memory")

    def fits(occ_block: int) -> bool:
        cost = energy_block_bytes(occ_block, nvir, naux, itemsize, fused, out_of_core)
        pair_block = (occ_block * nvir) ** 2 * itemsize
        return resident + cost <= budget and (fused or pair_block <= MAX_PAIR_BLOCK_BYTES)

    def enough_pairs(occ_block: int) -> bool:
        nblocks = -(-nocc // occ_block)
        return nblocks * (nblocks + 1) // 2 >= min_pairs

    if requested is not None:
        occ_block = max(1, min(max(nocc, 1), requested))
    else:
        occ_block = 1
        while occ_block < nocc and fits(occ_block + 1) and enough_pairs(occ_block + 1):
            occ_block += 1
        # As many blocks, evened out: 80 orbitals in blocks of 19 would leave a block of 4,
        # whose pairs run at a lower rate and leave the ranks' shares uneven.
        fewest = -(-max(nocc, 1) // occ_block)
        occ_block = -(-max(nocc, 1) // fewest)
        if ranks > 1:
            occ_block = _balanced_block(nocc, fewest, ranks)
    return BlockPlan(occ_block, -(-max(nocc, 1) // occ_block), out_of_core, fused, b_bytes,
                     energy_block_bytes(occ_block, nvir, naux, itemsize, fused, out_of_core),
                     max(build_minimum, min(MAX_BUILD_BLOCK_BYTES, budget - resident)), budget)
