"""Block sizes from a memory budget: how many occupied orbitals go in one energy block."""
from __future__ import annotations

from dataclasses import dataclass

from dfmp2.errors import InputError
from dfmp2.memory import format_size

# Temporaries of the energy reduction, in units of one orbital row (nvir x nj x nvir numbers).
REDUCTION_TEMPORARIES = 4
# A larger (ia|jb) block no longer speeds up the GEMM; it only costs memory.
MAX_PAIR_BLOCK_BYTES = 512 * 2**20
# The share of the budget the integral blocks of the build may use.
BUILD_FRACTION = 0.25


@dataclass(frozen=True)
class BlockPlan:
    occ_block: int
    nblocks: int
    resident_bytes: int
    energy_bytes: int
    build_block_bytes: int
    budget: int

    def as_attrs(self) -> dict[str, int]:
        return {"occ_block": self.occ_block, "occ_blocks": self.nblocks,
                "resident_bytes": self.resident_bytes, "energy_bytes": self.energy_bytes,
                "build_block_bytes": self.build_block_bytes, "budget_bytes": self.budget}


def energy_block_bytes(occ_block: int, nocc: int, nvir: int, itemsize: int, fused: bool) -> int:
    """Peak bytes the energy step allocates for blocks of ``occ_block`` occupied orbitals."""
    reduction = REDUCTION_TEMPORARIES * nvir * occ_block * nvir * itemsize
    if fused:
        stripe_rows = max(nvir, 512)
        return stripe_rows * occ_block * nvir * itemsize + reduction
    return (occ_block * nvir) ** 2 * itemsize + reduction


def plan_blocks(nocc: int, nvir: int, naux: int, nao: int, itemsize: int, budget: int,
                fused: bool, requested: int | None = None) -> BlockPlan:
    """The largest occupied block that fits beside the in-memory B (fp64, plus a copy in the
    kernel precision when that is narrower)."""
    resident = naux * nocc * nvir * (8 + (itemsize if itemsize != 8 else 0))
    build_block = max(8 * (nao * nao + nao * nocc + nocc * nvir), int(budget * BUILD_FRACTION))
    minimum = resident + energy_block_bytes(1, nocc, nvir, itemsize, fused)
    if budget < minimum:
        raise InputError(f"memory budget {format_size(budget)} is too small for this molecule: "
                         f"at least {format_size(minimum)} is needed; raise --memory")
    if requested is not None:
        occ_block = max(1, min(nocc, requested))
    else:
        occ_block = 1
        while occ_block < nocc:
            candidate = occ_block + 1
            cost = energy_block_bytes(candidate, nocc, nvir, itemsize, fused)
            pair_block = (candidate * nvir) ** 2 * itemsize
            if resident + cost > budget or (not fused and pair_block > MAX_PAIR_BLOCK_BYTES):
                break
            occ_block = candidate
    nblocks = -(-nocc // occ_block)
    return BlockPlan(occ_block, nblocks, resident,
                     energy_block_bytes(occ_block, nocc, nvir, itemsize, fused),
                     min(build_block, max(budget - resident, 8 * nao * nao)), budget)
