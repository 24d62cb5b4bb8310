"""Each rank's sign of life in the launch's key-value store, for the waits with no deadline.

A rank waiting for others' work with no deadline (the energy step's block pairs, a batch's
shares, :meth:`dfmp2.system.distributed.World.wait_until`) learns of a peer that died from
the store, the launcher or that peer's process. A peer that is alive but stopped (SIGSTOP, a
frozen node, a hung file system) gave none of these, and the wait went on for good. So every
rank counts up its own key from a thread of its own, with a connection of its own, as long
as its process runs, busy or not; a waiting rank that sees a peer's count stand still for
the whole ``DFMP2_DIST_TIMEOUT`` stops the job. Counts, not clock times, so the hosts' clocks
need not agree.
"""
from __future__ import annotations

import datetime as dt
import threading
import time

import torch.distributed as torch_dist

# Beats per DFMP2_DIST_TIMEOUT: a few missed beats (a pause of the process) are no silence.
BEATS_PER_TIMEOUT = 8
LONGEST_BEAT_SECONDS = 5.0


def beat_key(rank: int) -> str:
    return f"dfmp2/heartbeat/rank{rank}"


class Heartbeat:
    """This rank's beat: a daemon thread adding one to its key every interval until
    :meth:`stop`. A store that cannot be reached ends the thread quietly: the waits then
    fail on their own look at the store."""

    def __init__(self, host: str, port: int, rank: int, timeout_seconds: float) -> None:
        self._store = torch_dist.TCPStore(host, port, is_master=False,
                                          timeout=dt.timedelta(seconds=timeout_seconds))
        self._key = beat_key(rank)
        self._interval = min(LONGEST_BEAT_SECONDS, timeout_seconds / BEATS_PER_TIMEOUT)
        self._stopped = threading.Event()
        self._store.add(self._key, 1)
        self._thread = threading.Thread(target=self._beat, name="dfmp2-heartbeat", daemon=True)
        self._thread.start()

    def _beat(self) -> None:
        while not self._stopped.wait(self._interval):
            try:
                self._store.add(self._key, 1)
            except RuntimeError:
                return

    def stop(self) -> None:
        self._stopped.set()


class SilenceWatch:
    """The peers' beats as one wait sees them: which peer's count has stood still for
    longer than ``timeout_seconds`` since the wait began (None: none)."""

    def __init__(self, store, ranks: list[int], timeout_seconds: float) -> None:
        self.store, self.timeout_seconds = store, timeout_seconds
        now = time.monotonic()
        self.last = {rank: (self._count(rank), now) for rank in ranks}

    def _count(self, rank: int) -> int:
        return int(self.store.add(beat_key(rank), 0))

    def silent(self) -> str | None:
        now = time.monotonic()
        for rank, (count, since) in self.last.items():
            latest = self._count(rank)
            if latest != count:
                self.last[rank] = (latest, now)
            elif now - since > self.timeout_seconds:
                return (f"rank {rank} has not been heard from in {self.timeout_seconds:g} s "
                        "(its process is stopped or hung; DFMP2_DIST_TIMEOUT sets this limit)")
        return None
