"""Small results that ranks post as they finish pieces of work, and read as they arrive.

The energy step's ranks tell each other every block pair they finish (a few numbers each),
so that every rank's ledger, and rank 0's record, holds each pair soon after it is done.
They used to meet in an all-to-all after every round of pairs, whose timeout
(``DFMP2_DIST_TIMEOUT``) a rank with no pair left spent waiting for the others' pairs: a
single pair longer than it failed the job, and every resume again. Here each result is one
key of the process group's store, written by the rank that finished it and read by the
others whenever they look; a rank that has finished its own share waits for the rest with no
deadline (:meth:`dfmp2.system.distributed.World.wait_until`).
"""
from __future__ import annotations

import time

import numpy as np

from dfmp2.system.distributed import World, guarded_call

# How often a rank still computing looks for other ranks' results: often enough for rank 0
# to checkpoint them soon, rarely enough that R ranks looking at R keys each stay cheap.
LOOK_SECONDS = 0.05


class Board:
    """Results of ``width`` float64 numbers each; rank r posts ``counts[r]`` of them."""

    def __init__(self, world: World, counts: list[int], width: int, what: str) -> None:
        self.world, self.counts, self.width, self.what = world, list(counts), width, what
        self.read = [0] * world.size
        self.posted = 0
        self.own: list[np.ndarray] = []
        self.next_look = 0.0
        if world.size > 1:
            world.meetings += 1
            self.prefix = f"dfmp2/board{world.meetings}"
            self.keeper = world.store()

    @property
    def done(self) -> bool:
        """Whether every rank's every result has been read here."""
        return self.read == self.counts

    def post(self, result: np.ndarray) -> None:
        """This rank's next result, for every rank (itself included) to read."""
        result = np.ascontiguousarray(result, dtype=np.float64).ravel()
        if result.size != self.width:
            raise ValueError(f"a result of {result.size} numbers on a board of {self.width}")
        if self.world.size > 1:
            key = self._key(self.world.rank, self.posted)
            guarded_call(lambda: self.keeper.set(key, result.tobytes()), self.what)
        self.posted += 1
        self.own.append(result)

    def take(self, wait: bool = False) -> list[np.ndarray]:
        """The results posted since the last take, rank by rank: this rank's own at once,
        the others' when they have arrived (looked for at most every LOOK_SECONDS). With
        ``wait``, until at least one has, or every result is read."""
        if wait and not self.done:
            self.world.wait_until(self._news, self.what)
        elif time.monotonic() < self.next_look:
            return self._own_news()
        self.next_look = time.monotonic() + LOOK_SECONDS
        taken: list[np.ndarray] = []
        for rank in range(self.world.size):
            if rank == self.world.rank:
                taken += self._own_news()
                continue
            while self.read[rank] < self.counts[rank] and self._posted(rank, self.read[rank]):
                taken.append(self._get(rank, self.read[rank]))
                self.read[rank] += 1
        return taken

    def close(self) -> None:
        """Remove this rank's keys from the store. Call once every rank has read them (after
        a collective that follows every rank's last take)."""
        if self.world.size > 1:
            for index in range(self.posted):
                key = self._key(self.world.rank, index)
                guarded_call(lambda: self.keeper.delete_key(key), self.what)

    def _own_news(self) -> list[np.ndarray]:
        news = self.own[self.read[self.world.rank]:]
        self.read[self.world.rank] = len(self.own)
        return news

    def _news(self) -> bool:
        if len(self.own) > self.read[self.world.rank]:
            return True
        return any(self.read[rank] < self.counts[rank] and self._posted(rank, self.read[rank])
                   for rank in range(self.world.size) if rank != self.world.rank)

    def _key(self, rank: int, index: int) -> str:
        return f"{self.prefix}/rank{rank}/{index}"

    def _posted(self, rank: int, index: int) -> bool:
        return bool(guarded_call(lambda: self.keeper.check([self._key(rank, index)]),
                                 self.what))

    def _get(self, rank: int, index: int) -> np.ndarray:
        value = guarded_call(lambda: self.keeper.get(self._key(rank, index)), self.what)
        return np.frombuffer(value, dtype=np.float64).copy()
