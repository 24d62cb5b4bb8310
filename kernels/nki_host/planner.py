"""Launch planning for the NKI kernels: canonical (padded) sizes, chunks per launch, group
sizes, instruction budgets and the resident-or-streamed decisions the kernels take as
compile-time arguments.

Pure arithmetic on sizes (no arrays, no ``nki``): the host modules call it, the benchmark and
the tests read it. Hardware capacities and kernel tile sizes come from ``kernels/trn1.py``;
what is decided here is how much work one launch gets.

Why canonical sizes: every distinct (kernel, shapes, constants) is a separate compile (tens of
seconds cold), so sizes round up to the ladder 128 x {1, 2, 3, 4, 6, 8, 12, 16, 24, 32, ...}
(ratio <= 1.5 between neighbours; zero rows and columns contribute exactly zero) and one
compiled kernel serves every chunk of a molecule.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from kernels.trn1 import (ENERGY_STRIP_BYTES, FP32_BYTES, GEMM_MAX_N, GEMM_STRIP_BYTES,
                          OS_COL_GROUP, OS_MAX_COLS, OS_STRIP_BYTES, SBUF_BYTES_PER_PARTITION,
                          SPLIT_STRIP_BYTES, TILE, TILE_N)

LADDER_FACTORS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512)

# gemm-family launches: output rows per launch, and contraction per launch (a larger K is cut
# into chunks the host sums; it also bounds the terms the split gemm's exact head adds up)
GEMM_MAX_M = 512
GEMM_MAX_K = 8192

# Unrolled instructions of one launch: the Neuron runtime refuses kernels with too many inner
# instructions (docs/kernels.md, "Programming model" facts), so the host splits work beyond
# these into more launches.
TRSM_MAX_INSTRUCTIONS = 8192
ENERGY_MAX_INSTRUCTIONS = 8192

# Orbitals per side of one same-spin energy launch (powers of two: few signatures).
ENERGY_GROUPS = (1, 2, 4, 8, 16, 32)
# SBUF one same-spin energy launch may use: trn1's 192 KiB less headroom for the compiler's
# allocator, which may need more than the live bytes.
ENERGY_SBUF_BYTES = SBUF_BYTES_PER_PARTITION - 16 * 1024


def ladder(size: int, cap: int | None = None) -> int:
    """The canonical size for ``size`` (>= 1): the smallest ladder value >= size. With ``cap``
    (a ladder value) sizes above it become a multiple of ``cap`` (the host then launches
    ``size / cap`` chunks of the same signature)."""
    size = max(1, int(size))
    if cap is not None and size > cap:
        return cap * math.ceil(size / cap)
    for f in LADDER_FACTORS:
        if TILE * f >= size:
            return TILE * f
    top = TILE * LADDER_FACTORS[-1]
    return top * math.ceil(size / top)


def ladder_floor(limit: int) -> int:
    """The largest ladder value <= limit (at least 128)."""
    best = TILE
    for f in LADDER_FACTORS:
        if TILE * f <= limit:
            best = TILE * f
    return best


def round_up(size: int, multiple: int) -> int:
    """The smallest positive multiple of ``multiple`` >= size."""
    return multiple * max(1, math.ceil(size / multiple))


def pow2_ceil(n: int) -> int:
    """The smallest power of two >= n (1 for n <= 1)."""
    return 1 << max(0, math.ceil(math.log2(max(1, n))))


def tiles(size: int, tile: int) -> int:
    """Tiles of ``tile`` covering ``size`` (the last one ragged)."""
    return math.ceil(size / tile)


@dataclass(frozen=True)
class Chunks:
    """One dimension padded to a canonical size and cut into equal chunks, one per launch."""

    padded: int
    chunk: int

    @property
    def starts(self) -> range:
        return range(0, self.padded, self.chunk)

    @property
    def count(self) -> int:
        return self.padded // self.chunk


def chunked(size: int, cap: int) -> Chunks:
    """``size`` padded on the ladder, in chunks of at most ``cap`` (a ladder value)."""
    padded = ladder(size, cap)
    return Chunks(padded, min(padded, cap))


@dataclass(frozen=True)
class MatmulPlan:
    """Chunks of c (m, n) = a (m, k) @ b (k, n) for gemm_kernel / syrk_kernel /
    gemm_split_kernel launches: K chunks are summed on the host."""

    k: Chunks
    m: Chunks
    n: Chunks


def matmul_plan(m: int, k: int, n: int, strip_bytes: int = GEMM_STRIP_BYTES) -> MatmulPlan:
    """The chunks of one product; ``strip_bytes`` bounds the resident (k chunk, n chunk)
    strip (GEMM_STRIP_BYTES for gemm and syrk, SPLIT_STRIP_BYTES for the split gemm)."""
    k_chunks = chunked(k, GEMM_MAX_K)
    k_tiles = k_chunks.chunk // TILE
    n_cap = ladder_floor(min(GEMM_MAX_N, strip_bytes // (FP32_BYTES * k_tiles)))
    return MatmulPlan(k_chunks, chunked(m, GEMM_MAX_M), chunked(n, n_cap))


def syrk_plan(n: int, k: int) -> MatmulPlan:
    """a @ a.T for a (n, k): syrk_kernel launches on the diagonal blocks of n.chunk rows (the
    block size is the resident limit of one launch), gemm launches below them."""
    plan = matmul_plan(n, k, n)
    return MatmulPlan(plan.k, plan.n, plan.n)


def split_matmul_plan(m: int, k: int, n: int) -> MatmulPlan:
    """The chunks of a gemm_split_kernel product (b, its head and its tail resident)."""
    return matmul_plan(m, k, n, SPLIT_STRIP_BYTES)


def trsm_columns(n_padded: int, m: int) -> Chunks:
    """Right-hand-side columns per trsm_kernel launch: as many 512-column strips as the
    instruction budget allows (one launch whenever it can); n_padded is a multiple of TILE."""
    blocks = n_padded // TILE
    per_strip = blocks * (blocks - 1) + 7 * blocks  # DMA + matmul per L block, 7 per diagonal
    strips = max(1, TRSM_MAX_INSTRUCTIONS // per_strip)
    return chunked(m, ladder_floor(strips * TILE_N))


# ---- same-spin energies --------------------------------------------------------------------
def energy_strips_resident(x_tiles: int, nvir: int) -> bool:
    """Whether mp2_energy_fused_kernel keeps one orbital's b_row and b_col strips in SBUF."""
    return x_tiles * nvir * FP32_BYTES <= ENERGY_STRIP_BYTES


def energy_pair_instructions(nvir: int, x_tiles: int, fused: bool) -> int:
    """Unrolled instructions per (i, j) pair of the same-spin energy kernels."""
    a_tiles = tiles(nvir, TILE)
    b_tiles = tiles(nvir, TILE_N)
    count = a_tiles * a_tiles + 7 * a_tiles * b_tiles  # transposes + Vector work
    if fused:
        if energy_strips_resident(x_tiles, nvir):
            dma = x_tiles
        else:
            dma = a_tiles * x_tiles * (1 + b_tiles)
        count += dma + a_tiles * x_tiles * b_tiles + a_tiles * b_tiles
    else:
        count += a_tiles
    return count


def energy_group(nvir: int, x_tiles: int, n_orb: int, fused: bool) -> int:
    """Orbitals per side of one same-spin energy launch: the largest G of ENERGY_GROUPS within
    the instruction and SBUF budgets, and no larger than n_orb needs."""
    a_tiles = tiles(nvir, TILE)
    b_tiles = tiles(nvir, TILE_N)
    per_pair = energy_pair_instructions(nvir, x_tiles, fused)
    need = pow2_ceil(n_orb)
    best = 1
    for g in ENERGY_GROUPS:
        if g > need:
            break
        instructions = g * g * per_pair + g * (x_tiles + 3 * b_tiles + a_tiles) + 8
        slots = g * g * a_tiles * b_tiles * 2
        sbuf = (2 * a_tiles * nvir + g * nvir + slots + g * a_tiles) * FP32_BYTES + 24 * 1024
        if fused and energy_strips_resident(x_tiles, nvir):
            sbuf += 2 * x_tiles * nvir * FP32_BYTES
        if g == 1 or (instructions <= ENERGY_MAX_INSTRUCTIONS and sbuf <= ENERGY_SBUF_BYTES):
            best = g
        else:
            break
    return best


@dataclass(frozen=True)
class SameSpinPlan:
    """Launch geometry of a same-spin energy block: ``rows`` x ``cols`` orbitals per launch
    (``group`` on a diagonal block), the partial-slot tiling, and the resident decision."""

    group: int
    rows: int
    cols: int
    a_tiles: int
    b_tiles: int
    resident: bool


def same_spin_plan(ni: int, nj: int, nvir: int, x_tiles: int, diagonal_block: bool,
                   fused: bool) -> SameSpinPlan:
    """``x_tiles`` = naux / TILE (0 for the plain kernel). A side smaller than the group gets
    a smaller power of two, except on a diagonal block, whose launches must be square."""
    g = energy_group(nvir, x_tiles, max(ni, nj), fused)
    rows = g if diagonal_block else min(g, pow2_ceil(ni))
    cols = g if diagonal_block else min(g, pow2_ceil(nj))
    return SameSpinPlan(g, rows, cols, tiles(nvir, TILE), tiles(nvir, TILE_N),
                        fused and energy_strips_resident(x_tiles, nvir))


# ---- opposite-spin energies ----------------------------------------------------------------
def os_strips_resident(x_tiles: int, n_cols: int) -> bool:
    """Whether mp2_energy_os_fused_kernel keeps the b_col block and a b_row strip in SBUF."""
    return x_tiles * (n_cols + TILE) * FP32_BYTES <= OS_STRIP_BYTES


def os_row_instructions(n_cols: int, x_tiles: int, fused: bool) -> int:
    """Unrolled instructions per 128-row tile of an opposite-spin launch of n_cols columns."""
    c_tiles = tiles(n_cols, TILE_N)
    count = 1 + 5 * c_tiles  # row denominators; Vector work per T tile
    if not fused:
        return count + 1  # one DMA of the T strip
    if os_strips_resident(x_tiles, n_cols):
        return count + x_tiles + c_tiles * x_tiles  # b_row strip DMAs, matmuls
    groups = tiles(c_tiles, OS_COL_GROUP)
    return count + groups * x_tiles + 2 * c_tiles * x_tiles  # streamed tiles


@dataclass(frozen=True)
class OppositeSpinPlan:
    """Launches of an opposite-spin block: (row chunk x column chunk) tiles of the flat
    (i, a) x (j, b) matrix, and the resident decision of the fused kernel."""

    rows: Chunks
    cols: Chunks
    resident: bool


def opposite_spin_plan(n_rows: int, n_cols: int, x_tiles: int, fused: bool) -> OppositeSpinPlan:
    """``x_tiles`` = naux / TILE (0 for the plain kernel)."""
    col_cap = OS_MAX_COLS
    if fused:
        col_cap = min(col_cap, ladder_floor(OS_STRIP_BYTES // (FP32_BYTES * x_tiles) - TILE))
    cols = chunked(n_cols, col_cap)
    fixed = 8 + 2 * tiles(cols.chunk, TILE_N) + x_tiles
    per_row = os_row_instructions(cols.chunk, x_tiles, fused)
    rows = chunked(n_rows, ladder_floor(TILE * max(1, (ENERGY_MAX_INSTRUCTIONS - fixed)
                                                   // per_row)))
    return OppositeSpinPlan(rows, cols, fused and os_strips_resident(x_tiles, cols.chunk))
