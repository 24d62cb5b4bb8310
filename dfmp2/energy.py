"""The energy step: occupied block pairs of B reduced to (direct, exchange) sums.

Closed shell: one spin channel, pairs I <= J, E_OS = direct, E_SS = direct - exchange.
Open shell (UHF): same-spin cases alpha-alpha and beta-beta over pairs I <= J, each adding
(direct - exchange) / 2 to E_SS, and the opposite-spin case alpha-beta over every pair of
blocks, adding its direct sum to E_OS.
"""
from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import torch

from dfmp2.distributed import DIAGONAL_COST, World, deal_pairs
from dfmp2.errors import RunFailure
from dfmp2.progress import Progress

log = logging.getLogger(__name__)

SCS_OS_DEFAULT = 1.2
SCS_SS_DEFAULT = 1.0 / 3.0
SOS_OS_DEFAULT = 1.3

Block = tuple[int, int]
PairKey = tuple[int, int, int, int, int]
PairCallback = Callable[[PairKey, float, float], None]


@dataclass(frozen=True)
class Mp2Energies:
    """Opposite- and same-spin correlation energies, plus the parts they came from."""

    e_os: float
    e_ss: float
    components: dict[str, float] = field(default_factory=dict)

    @property
    def e_corr(self) -> float:
        return self.e_os + self.e_ss

    def e_scs(self, os_scale: float = SCS_OS_DEFAULT, ss_scale: float = SCS_SS_DEFAULT) -> float:
        return os_scale * self.e_os + ss_scale * self.e_ss

    def e_sos(self, os_scale: float = SOS_OS_DEFAULT) -> float:
        return os_scale * self.e_os


@dataclass(frozen=True)
class SpinCase:
    """Which channels' blocks are paired: ``rows`` and ``cols`` index the spin channels."""

    name: str
    rows: int
    cols: int

    @property
    def same_spin(self) -> bool:
        return self.rows == self.cols


CLOSED_SHELL_CASES = (SpinCase("closed", 0, 0),)
OPEN_SHELL_CASES = (SpinCase("alpha-alpha", 0, 0), SpinCase("beta-beta", 1, 1),
                    SpinCase("alpha-beta", 0, 1))


def occupied_blocks(nocc: int, occ_block: int) -> list[Block]:
    return [(i0, min(nocc, i0 + occ_block)) for i0 in range(0, nocc, occ_block)]


def block_pairs(nocc: int, occ_block: int) -> list[tuple[Block, Block]]:
    blocks = occupied_blocks(nocc, occ_block)
    return [(bi, bj) for n, bi in enumerate(blocks) for bj in blocks[n:]]


class BlockReader:
    """Occupied column blocks of one channel's B in the kernel precision and device. An
    in-memory B is converted once; a scratch B is read block by block."""

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


def _check_finite(values: tuple[float, float], case: SpinCase, block_i: Block,
                  block_j: Block) -> None:
    if not all(math.isfinite(v) for v in values):
        raise RunFailure(f"the energy kernel returned a non-finite value for {case.name} "
                         f"occupied blocks [{block_i[0]}:{block_i[1]}] x "
                         f"[{block_j[0]}:{block_j[1]}]")


def pair_sums(b_i: torch.Tensor, b_j: torch.Tensor, denom_i: torch.Tensor,
              denom_j: torch.Tensor, kern, case: SpinCase, block_i: Block, block_j: Block,
              fused: bool) -> tuple[float, float]:
    """Weighted (direct, exchange) of one block pair; same-spin off-diagonal pairs count twice
    (they stand for J < I too)."""
    d_i = denom_i[block_i[0]:block_i[1]].reshape(-1)
    d_j = denom_j[block_j[0]:block_j[1]].reshape(-1)
    if not case.same_spin:
        nvir_i, nvir_j = denom_i.shape[1], denom_j.shape[1]
        if fused:
            direct = kern.mp2_energy_os_fused(b_i, b_j, d_i, d_j, nvir_i, nvir_j)
        else:
            direct = kern.mp2_energy_os(kern.gemm(b_i.T, b_j), d_i, d_j, nvir_i, nvir_j)
        _check_finite((direct, 0.0), case, block_i, block_j)
        return direct, 0.0
    nvir = denom_i.shape[1]
    diagonal = block_i == block_j
    if fused:
        sums = kern.mp2_energy_fused(b_i, b_j, d_i, d_j, nvir, diagonal)
    else:
        block = kern.syrk(b_i.T, nvir) if diagonal else kern.gemm(b_i.T, b_j)
        sums = kern.mp2_energy(block, d_i, d_j, nvir, diagonal)
    _check_finite(sums, case, block_i, block_j)
    weight = 1.0 if diagonal else 2.0
    return weight * sums[0], weight * sums[1]


def orbital_denominators(e_occ: torch.Tensor, e_vir: torch.Tensor,
                         dtype: torch.dtype) -> torch.Tensor:
    """e_i - e_a (nocc, nvir); a non-aufbau reference (any value >= 0) is refused."""
    denom = e_occ[:, None] - e_vir[None, :]
    if bool((denom >= 0).any()):
        raise RunFailure("an occupied orbital lies at or above a virtual one (non-aufbau "
                         "occupation): MP2 denominators would be non-negative")
    return denom.to(dtype)


def case_pairs(case: SpinCase, nocc: list[int], occ_block: int) -> list[tuple[Block, Block]]:
    if case.same_spin:
        return block_pairs(nocc[case.rows], occ_block)
    return [(bi, bj) for bi in occupied_blocks(nocc[case.rows], occ_block)
            for bj in occupied_blocks(nocc[case.cols], occ_block)]


def combine(cases: tuple[SpinCase, ...], sums: dict[PairKey, tuple[float, float]]) -> Mp2Energies:
    """E_OS and E_SS from the pair sums, added in a fixed order with compensated sums."""
    totals = {}
    for index, case in enumerate(cases):
        parts = [sums[key] for key in sorted(sums) if key[0] == index]
        totals[case.name] = (math.fsum(d for d, _ in parts), math.fsum(x for _, x in parts))
    if len(cases) == 1:
        direct, exchange = totals["closed"]
        return Mp2Energies(direct, direct - exchange, {"direct": direct, "exchange": exchange})
    e_ss_alpha = 0.5 * (totals["alpha-alpha"][0] - totals["alpha-alpha"][1])
    e_ss_beta = 0.5 * (totals["beta-beta"][0] - totals["beta-beta"][1])
    return Mp2Energies(totals["alpha-beta"][0], e_ss_alpha + e_ss_beta,
                       {"e_ss_alpha": e_ss_alpha, "e_ss_beta": e_ss_beta})


def pair_cost(item: tuple) -> float:
    """Relative cost of a work item (case index, case, block_i, block_j)."""
    _, case, (i0, i1), (j0, j1) = item
    cost = float((i1 - i0) * (j1 - j0))
    return cost * DIAGONAL_COST if case.same_spin and (i0, i1) == (j0, j1) else cost


def energy_sums(readers: list[BlockReader], e_occ: list[torch.Tensor],
                e_vir: list[torch.Tensor], kern, occ_block: int, fused: bool,
                show_progress: bool | None = None,
                finished: dict[PairKey, tuple[float, float]] | None = None,
                on_pair: PairCallback | None = None, world: World | None = None,
                rank_log: dict | None = None) -> Mp2Energies:
    """Sum every block pair of every spin case; the next column block is read while this one
    computes. ``finished`` holds pairs done before (a resumed run), keyed (case, i0, i1, j0, j1):
    they are not recomputed. ``on_pair`` sees each newly finished pair, e.g. to checkpoint it.

    With a ``world`` of several ranks, each rank computes the pairs dealt to it, and after every
    round all ranks gather what was finished (``on_pair`` then sees every rank's pairs);
    ``rank_log`` receives each rank's pair list and busy seconds.
    """
    world = world or World()
    cases = CLOSED_SHELL_CASES if len(readers) == 1 else OPEN_SHELL_CASES
    denoms = [orbital_denominators(o, v, readers[0].dtype) for o, v in zip(e_occ, e_vir)]
    nocc = [int(o.shape[0]) for o in e_occ]
    sums = dict(finished or {})
    work = [(index, case, bi, bj) for index, case in enumerate(cases)
            for bi, bj in case_pairs(case, nocc, occ_block) if (index, *bi, *bj) not in sums]
    # Dealt by cost, then walked in block order so that each rank reuses its row block.
    assignment = [sorted(batch, key=lambda item: (item[0], item[2], item[3]))
                  for batch in deal_pairs(work, pair_cost, world.size)]
    mine = assignment[world.rank]
    rounds = max(len(batch) for batch in assignment)
    progress = Progress(len(work), "energy blocks", show_progress if world.is_root else False)
    busy = 0.0
    row_key, row_data = None, None
    with ThreadPoolExecutor(max_workers=1) as pool:
        def read(item):
            return readers[item[1].cols].block(item[3])

        upcoming = pool.submit(read, mine[0]) if mine else None
        for n in range(rounds):
            done = None
            if n < len(mine):
                start = time.perf_counter()
                index, case, block_i, block_j = mine[n]
                b_j = upcoming.result()
                if n + 1 < len(mine):
                    upcoming = pool.submit(read, mine[n + 1])
                if (case.rows, block_i) != row_key:
                    row_key = (case.rows, block_i)
                    row_data = (b_j if case.same_spin and block_i == block_j
                                else readers[case.rows].block(block_i))
                d, x = pair_sums(row_data, b_j, denoms[case.rows], denoms[case.cols], kern,
                                 case, block_i, block_j, fused)
                done = ((index, *block_i, *block_j), d, x)
                busy += time.perf_counter() - start
            for result in world.gather(done, "exchanging finished block pairs"):
                if result is None:
                    continue
                key, d, x = result
                sums[key] = (d, x)
                if on_pair is not None:
                    on_pair(key, d, x)
                progress.advance()
    if rank_log is not None:
        logs = world.gather({"pairs": [list(item[2]) + list(item[3]) + [item[0]]
                                       for item in mine], "seconds": busy},
                            "collecting per-rank timings")
        rank_log.update({f"rank{r}": entry for r, entry in enumerate(logs)})
    log.info("energy step: %d block pairs of up to %d occupied orbitals (%d resumed)",
             len(sums), occ_block, len(sums) - len(work))
    return combine(cases, sums)
