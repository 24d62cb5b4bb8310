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
from dataclasses import dataclass, field

import numpy as np
import torch

from dfmp2.system.board import Board
from dfmp2.system.distributed import DIAGONAL_COST, World, deal_pairs
from dfmp2.errors import RunFailure
from dfmp2.mp2.methods import SCS_OS_DEFAULT, SCS_SS_DEFAULT, SOS_OS_DEFAULT
from dfmp2.system.progress import Progress
from kernels.threads import ReadAhead

log = logging.getLogger(__name__)


OccRange = tuple[int, int]
PairKey = tuple[int, int, int, int, int]
# A finished pair as the ranks post it: its key and its (direct, exchange) sums.
PAIR_MESSAGE = 7


@dataclass
class PairLedger:
    """Finished block pairs, keyed (spin case, i0, i1, j0, j1), with their weighted (direct,
    exchange) sums: those a resumed run starts with, and every new one as it finishes.
    ``on_finish`` sees each new pair, e.g. to save it in the run record."""

    finished: dict[PairKey, tuple[float, float]] = field(default_factory=dict)
    on_finish: Callable[[PairKey, float, float], None] | None = None

    def add(self, key: PairKey, direct: float, exchange: float) -> None:
        self.finished[key] = (direct, exchange)
        if self.on_finish is not None:
            self.on_finish(key, direct, exchange)


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
    """Which spin channels' occupied blocks are paired: the first block of a pair comes from
    channel ``row_channel``, the second from ``col_channel`` (0 alpha or closed shell, 1 beta)."""

    name: str
    row_channel: int
    col_channel: int

    @property
    def same_spin(self) -> bool:
        return self.row_channel == self.col_channel


CLOSED_SHELL_CASES = (SpinCase("closed", 0, 0),)
OPEN_SHELL_CASES = (SpinCase("alpha-alpha", 0, 0), SpinCase("beta-beta", 1, 1),
                    SpinCase("alpha-beta", 0, 1))


def occupied_blocks(nocc: int, occ_block: int) -> list[OccRange]:
    """Blocks of ``occ_block`` occupied orbitals (none for an empty spin)."""
    return [(i0, min(nocc, i0 + occ_block)) for i0 in range(0, nocc, max(occ_block, 1))]


def block_pairs(nocc: int, occ_block: int) -> list[tuple[OccRange, OccRange]]:
    blocks = occupied_blocks(nocc, occ_block)
    return [(bi, bj) for n, bi in enumerate(blocks) for bj in blocks[n:]]


class BlockReader:
    """The columns of one channel's B that belong to an occupied block, in the kernel
    precision and device. An in-memory B is converted once; a scratch B is read per block."""

    def __init__(self, store, nvir: int, dtype: torch.dtype, device: torch.device) -> None:
        self.nvir, self.dtype, self.device = nvir, dtype, device
        self.store = store
        self.whole = (store.data.to(device=device, dtype=dtype)
                      if store.location == "memory" else None)

    def columns(self, occ: OccRange) -> torch.Tensor:
        c0, c1 = occ[0] * self.nvir, occ[1] * self.nvir
        if self.whole is not None:
            return self.whole[:, c0:c1]
        return self.store.read_columns(c0, c1).to(device=self.device, dtype=self.dtype)


def _check_finite(values: tuple[float, float], case: SpinCase, block_i: OccRange,
                  block_j: OccRange) -> None:
    if not all(math.isfinite(v) for v in values):
        raise RunFailure(f"the energy kernel returned a non-finite value for {case.name} "
                         f"occupied blocks [{block_i[0]}:{block_i[1]}] x "
                         f"[{block_j[0]}:{block_j[1]}]")


def pair_sums(b_i: torch.Tensor, b_j: torch.Tensor, denom_i: torch.Tensor,
              denom_j: torch.Tensor, kernel_set, case: SpinCase, block_i: OccRange,
              block_j: OccRange, fused: bool,
              pair_storage: torch.Tensor | None = None) -> tuple[float, float]:
    """Weighted (direct, exchange) of one block pair; same-spin off-diagonal pairs count twice
    (they stand for J < I too). Unfused, the pair's (ia|jb) block goes into ``pair_storage`` (flat,
    the kernel set's dtype and device, at least the block's size) when given."""
    d_i = denom_i[block_i[0]:block_i[1]].reshape(-1)
    d_j = denom_j[block_j[0]:block_j[1]].reshape(-1)
    if not case.same_spin:
        nvir_i, nvir_j = denom_i.shape[1], denom_j.shape[1]
        if fused:
            direct = kernel_set.mp2_energy_os_fused(b_i, b_j, d_i, d_j, nvir_i, nvir_j)
        else:
            ovov = kernel_set.gemm(b_i.T, b_j, out=_pair_block(pair_storage, b_i, b_j))
            direct = kernel_set.mp2_energy_os(ovov, d_i, d_j, nvir_i, nvir_j)
        _check_finite((direct, 0.0), case, block_i, block_j)
        return direct, 0.0
    nvir = denom_i.shape[1]
    diagonal_block = block_i == block_j
    if fused:
        sums = kernel_set.mp2_energy_fused(b_i, b_j, d_i, d_j, nvir, diagonal_block)
    else:
        ovov = (kernel_set.syrk(b_i.T, nvir, out=_pair_block(pair_storage, b_i, b_i))
                if diagonal_block else
                kernel_set.gemm(b_i.T, b_j, out=_pair_block(pair_storage, b_i, b_j)))
        sums = kernel_set.mp2_energy(ovov, d_i, d_j, nvir, diagonal_block)
    _check_finite(sums, case, block_i, block_j)
    weight = 1.0 if diagonal_block else 2.0
    return weight * sums[0], weight * sums[1]


def _pair_block(pair_storage: torch.Tensor | None, b_i: torch.Tensor,
                b_j: torch.Tensor) -> torch.Tensor | None:
    """The (ia|jb) block of columns ``b_i`` and ``b_j`` as a view of ``pair_storage``."""
    if pair_storage is None:
        return None
    return pair_storage[:b_i.shape[1] * b_j.shape[1]].view(b_i.shape[1], b_j.shape[1])


def orbital_denominators(e_occ: torch.Tensor, e_vir: torch.Tensor,
                         dtype: torch.dtype) -> torch.Tensor:
    """e_i - e_a (nocc, nvir); a non-aufbau reference (any value >= 0) is refused."""
    denom = e_occ[:, None] - e_vir[None, :]
    if bool((denom >= 0).any()):
        raise RunFailure("an occupied orbital lies at or above a virtual one (non-aufbau "
                         "occupation): MP2 denominators would be non-negative")
    return denom.to(dtype)


def case_pairs(case: SpinCase, nocc: list[int],
               occ_block: int) -> list[tuple[OccRange, OccRange]]:
    if case.same_spin:
        return block_pairs(nocc[case.row_channel], occ_block)
    return [(bi, bj) for bi in occupied_blocks(nocc[case.row_channel], occ_block)
            for bj in occupied_blocks(nocc[case.col_channel], occ_block)]


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
                e_vir: list[torch.Tensor], kernel_set, occ_block: int, fused: bool,
                ledger: PairLedger, world: World, show_progress: bool | None = None
                ) -> tuple[Mp2Energies, dict[int, tuple[list, float]]]:
    """Sum every block pair of every spin case; the next column block is read while this one
    computes. Pairs already in ``ledger`` (a resumed run) are not recomputed; each new one is
    added to it as it finishes.

    With a ``world`` of several ranks, each rank computes the pairs dealt to it and posts
    each one as it finishes (:class:`dfmp2.system.board.Board`): every rank's ledger takes
    the other ranks' pairs as they arrive, and a rank whose share is done waits for the rest
    with no deadline, so no pair, however long, runs into ``DFMP2_DIST_TIMEOUT``. Returns
    the energies and, per rank, its pairs and busy seconds.
    """
    cases = CLOSED_SHELL_CASES if len(readers) == 1 else OPEN_SHELL_CASES
    denoms = [orbital_denominators(o, v, readers[0].dtype) for o, v in zip(e_occ, e_vir)]
    nocc = [int(o.shape[0]) for o in e_occ]
    every_pair = [(index, case, bi, bj) for index, case in enumerate(cases)
                  for bi, bj in case_pairs(case, nocc, occ_block)]
    work = [item for item in every_pair if pair_key(item) not in ledger.finished]
    # Dealt by cost, then walked in block order so that each rank reuses its row block.
    assignment = [sorted(batch, key=lambda item: (item[0], item[2], item[3]))
                  for batch in deal_pairs(work, pair_cost, world.size)]
    mine = assignment[world.rank]
    progress = Progress(len(work), "energy blocks", show_progress if world.is_root else False)
    busy = 0.0
    row_key, row_data = None, None
    board = Board(world, [len(batch) for batch in assignment], PAIR_MESSAGE,
                  "exchanging finished block pairs")
    # One pair block's storage for every pair: a fresh 190 MB block per pair of (H2O)16 made
    # each pair's product 6% slower (page faults; 0.83 s against 0.78 s on two threads).
    widest = occ_block * max(int(v.shape[0]) for v in e_vir)
    pair_storage = (None if fused or not mine else
                    torch.empty(widest * widest, dtype=readers[0].dtype,
                                device=readers[0].device))

    def record(results: list[np.ndarray]) -> None:
        for key, direct, exchange in _finished_pairs(results):
            ledger.add(key, direct, exchange)
            progress.advance()

    def read(item):
        return readers[item[1].col_channel].columns(item[3])

    with ReadAhead(read) as reading:
        upcoming = reading.start(mine[0]) if mine else None
        for n, item in enumerate(mine):
            start = time.perf_counter()
            _, case, block_i, block_j = item
            b_j = upcoming()
            if n + 1 < len(mine):
                upcoming = reading.start(mine[n + 1])
            if (case.row_channel, block_i) != row_key:
                row_key = (case.row_channel, block_i)
                row_data = (b_j if case.same_spin and block_i == block_j
                            else readers[case.row_channel].columns(block_i))
            d, x = pair_sums(row_data, b_j, denoms[case.row_channel],
                             denoms[case.col_channel], kernel_set, case, block_i, block_j,
                             fused, pair_storage)
            busy += time.perf_counter() - start
            board.post(_pair_message(pair_key(item), d, x))
            record(board.take())
    while not board.done:
        record(board.take(wait=True))
    logs = world.gather(([list(item[2]) + list(item[3]) + [item[0]] for item in mine], busy),
                        "collecting per-rank timings")
    # Every rank has read every pair (its last take came before this gather).
    board.close()
    log.info("energy step: %d block pairs of up to %d occupied orbitals (%d resumed)",
             len(every_pair), occ_block, len(every_pair) - len(work))
    sums = {pair_key(item): ledger.finished[pair_key(item)] for item in every_pair}
    return combine(cases, sums), dict(enumerate(logs))


def _pair_message(key: PairKey, direct: float, exchange: float) -> np.ndarray:
    """A finished pair as PAIR_MESSAGE numbers (the key's small integers are exact in
    float64)."""
    return np.array([*key, direct, exchange], dtype=np.float64)


def _finished_pairs(messages: list[np.ndarray]) -> list[tuple[PairKey, float, float]]:
    return [(tuple(int(k) for k in message[:5]), float(message[5]), float(message[6]))
            for message in messages]


def pair_key(item: tuple) -> PairKey:
    """The ledger key (case index, i0, i1, j0, j1) of a work item (index, case, bi, bj)."""
    index, _, block_i, block_j = item
    return (index, *block_i, *block_j)
