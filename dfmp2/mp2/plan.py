"""Memory plan: where B lives and how many occupied orbitals go in one energy block."""
from __future__ import annotations

from dataclasses import dataclass

from dfmp2.errors import InputError
from dfmp2.system.memory import B_IN_MEMORY_SHARE, FP64_BYTES, fits_in_memory, format_size

# Temporaries of the energy reduction, in units of one orbital row (nvir x nj x nvir numbers).
REDUCTION_TEMPORARIES = 4
# A larger (ia|jb) block no longer speeds up the GEMM; it only costs memory.
MAX_PAIR_BLOCK_BYTES = 256 * 2**20
# Blocks of B held at once out of core: the row block, the column block and the one prefetched.
OUT_OF_CORE_BLOCKS = 3
# Integral blocks beyond this size make no build step faster, only the peak memory higher.
MAX_BUILD_BLOCK_BYTES = 512 * 2**20


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


def plan_blocks(sizes: list[tuple[int, int]], naux: int, nao: int, itemsize: int, budget: int,
                fused: bool, requested: int | None = None,
                force_out_of_core: bool = False, min_pairs: int = 1) -> BlockPlan:
    """Keep B (one per spin channel, ``sizes`` = [(nocc, nvir), ...]) in memory when it fits
    comfortably, else stream it from scratch; then take the largest occupied block that fits
    what is left and still gives at least ``min_pairs`` block pairs I <= J (work for every
    rank of a distributed run)."""
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
                         f"at least {format_size(minimum)} is needed; raise --memory")

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
    return BlockPlan(occ_block, -(-max(nocc, 1) // occ_block), out_of_core, fused, b_bytes,
                     energy_block_bytes(occ_block, nvir, naux, itemsize, fused, out_of_core),
                     max(build_minimum, min(MAX_BUILD_BLOCK_BYTES, budget - resident)), budget)
