"""The energy step: occupied block pairs I <= J of B reduced to (direct, exchange) sums."""
from __future__ import annotations

import logging
import math
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import torch

from dfmp2.errors import RunFailure
from dfmp2.progress import Progress

log = logging.getLogger(__name__)

SCS_OS_DEFAULT = 1.2
SCS_SS_DEFAULT = 1.0 / 3.0

Block = tuple[int, int]


@dataclass(frozen=True)
class Mp2Energies:
    """Closed-shell MP2 components from direct = sum T^2/D and exchange = sum T T'/D."""

    direct: float
    exchange: float

    @property
    def e_os(self) -> float:
        return self.direct

    @property
    def e_ss(self) -> float:
        return self.direct - self.exchange

    @property
    def e_corr(self) -> float:
        return self.e_os + self.e_ss

    def e_scs(self, os_scale: float = SCS_OS_DEFAULT, ss_scale: float = SCS_SS_DEFAULT) -> float:
        return os_scale * self.e_os + ss_scale * self.e_ss


def occupied_blocks(nocc: int, occ_block: int) -> list[Block]:
    return [(i0, min(nocc, i0 + occ_block)) for i0 in range(0, nocc, occ_block)]


def block_pairs(nocc: int, occ_block: int) -> list[tuple[Block, Block]]:
    blocks = occupied_blocks(nocc, occ_block)
    return [(bi, bj) for n, bi in enumerate(blocks) for bj in blocks[n:]]


class BlockReader:
    """Occupied column blocks of B in the kernel precision and device. An in-memory B is
    converted once; a scratch B is read block by block."""

    def __init__(self, store, nvir: int, dtype: torch.dtype, device: torch.device) -> None:
        self.nvir, self.dtype, self.device = nvir, dtype, device
        self.store = store
        self.whole = (store.data.to(device=device, dtype=dtype)
                      if store.location == "memory" else None)

    def block(self, block: Block) -> torch.Tensor:
        c0, c1 = block[0] * self.nvir, block[1] * self.nvir
        if self.whole is not None:
            return self.whole[:, c0:c1]
        return self.store.read_columns(c0, c1).to(device=self.device, dtype=self.dtype)


def pair_sums(b_i: torch.Tensor, b_j: torch.Tensor, denom: torch.Tensor, kern, block_i: Block,
              block_j: Block, fused: bool) -> tuple[float, float]:
    """Weighted (direct, exchange) of one block pair; off-diagonal pairs count twice."""
    nvir = denom.shape[1]
    diagonal = block_i == block_j
    d_i = denom[block_i[0]:block_i[1]].reshape(-1)
    d_j = denom[block_j[0]:block_j[1]].reshape(-1)
    if fused:
        direct, exchange = kern.mp2_energy_fused(b_i, b_j, d_i, d_j, nvir, diagonal)
    else:
        block = kern.syrk(b_i.T, nvir) if diagonal else kern.gemm(b_i.T, b_j)
        direct, exchange = kern.mp2_energy(block, d_i, d_j, nvir, diagonal)
    if not (math.isfinite(direct) and math.isfinite(exchange)):
        raise RunFailure(f"the energy kernel returned a non-finite value for occupied blocks "
                         f"[{block_i[0]}:{block_i[1]}] x [{block_j[0]}:{block_j[1]}]")
    weight = 1.0 if diagonal else 2.0
    return weight * direct, weight * exchange


def orbital_denominators(e_occ: torch.Tensor, e_vir: torch.Tensor,
                         dtype: torch.dtype) -> torch.Tensor:
    """e_i - e_a (nocc, nvir); a non-aufbau reference (any value >= 0) is refused."""
    denom = e_occ[:, None] - e_vir[None, :]
    if bool((denom >= 0).any()):
        raise RunFailure("an occupied orbital lies at or above a virtual one (non-aufbau "
                         "occupation): MP2 denominators would be non-negative")
    return denom.to(dtype)


PairKey = tuple[int, int, int, int]
PairCallback = Callable[[PairKey, float, float], None]


def energy_sums(reader: BlockReader, e_occ: torch.Tensor, e_vir: torch.Tensor, kern,
                occ_block: int, fused: bool, show_progress: bool | None = None,
                finished: dict[PairKey, tuple[float, float]] | None = None,
                on_pair: PairCallback | None = None) -> Mp2Energies:
    """Sum every block pair I <= J; the next column block is read while this one computes.

    ``finished`` holds weighted sums of pairs done before (a resumed run): they are not
    recomputed. ``on_pair`` is called with each newly finished pair, e.g. to checkpoint it.
    """
    denom = orbital_denominators(e_occ, e_vir, reader.dtype)
    finished = dict(finished or {})
    pairs = [(bi, bj) for bi, bj in block_pairs(e_occ.shape[0], occ_block)
             if (*bi, *bj) not in finished]
    progress = Progress(len(pairs), "energy blocks", show_progress)
    sums = dict(finished)
    row_block, row_data = None, None
    with ThreadPoolExecutor(max_workers=1) as pool:
        upcoming = pool.submit(reader.block, pairs[0][1]) if pairs else None
        for n, (block_i, block_j) in enumerate(pairs):
            b_j = upcoming.result()
            if n + 1 < len(pairs):
                upcoming = pool.submit(reader.block, pairs[n + 1][1])
            if block_i != row_block:
                row_block = block_i
                row_data = b_j if block_i == block_j else reader.block(block_i)
            d, x = pair_sums(row_data, b_j, denom, kern, block_i, block_j, fused)
            sums[(*block_i, *block_j)] = (d, x)
            if on_pair is not None:
                on_pair((*block_i, *block_j), d, x)
            progress.advance()
    log.info("energy step: %d block pairs of up to %d occupied orbitals (%d resumed)",
             len(sums), occ_block, len(finished))
    ordered = [sums[key] for key in sorted(sums)]
    return Mp2Energies(math.fsum(d for d, _ in ordered), math.fsum(x for _, x in ordered))
