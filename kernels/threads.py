"""Starting threads where a signal handler may raise.

The command's SIGTERM/SIGINT handler raises an exception in the main thread at whatever
bytecode the signal lands on. Landing inside ``Thread.start`` (a thread pool's first
``submit``: ours, or PySCF's prefetch of a JK-fit tensor file), it left the threading
module's bookkeeping half done, and the new thread printed a KeyError traceback before the
command's one error line. While a thread starts (:func:`threads_starting`, around every
``Thread.start`` once :func:`guard_thread_starts` has run), the handler hands what it would
raise to :func:`defer` instead, and it is raised as soon as the thread has started.
"""
from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Generic, TypeVar

log = logging.getLogger(__name__)
Item = TypeVar("Item")
Result = TypeVar("Result")

_depth = 0
_deferred: list[Callable[[], None]] = []


def starting() -> bool:
    """Whether the main thread is starting threads now."""
    return _depth > 0


def defer(action: Callable[[], None]) -> None:
    """Run ``action`` (a signal handler's raise) once the threads have started."""
    _deferred.append(action)


@contextlib.contextmanager
def threads_starting() -> Iterator[None]:
    global _depth
    _depth += 1
    try:
        yield
    finally:
        _depth -= 1
    if _depth == 0 and _deferred:
        actions = list(_deferred)
        _deferred.clear()
        for action in actions:
            action()


def guard_thread_starts() -> None:
    """Start every thread of this process inside :func:`threads_starting` (for a program
    whose signal handler raises; idempotent)."""
    start = threading.Thread.start
    if getattr(start, "guarded", False):
        return

    def guarded_start(self: threading.Thread) -> None:
        with threads_starting():
            start(self)

    guarded_start.guarded = True
    threading.Thread.start = guarded_start


class ReadAhead(Generic[Item, Result]):
    """``function`` of the next item, started in a worker thread while the caller works on
    the last one. Where no thread can be started (a process limit: ``ulimit -u``, a
    container's pids limit), each call runs in the caller's thread when its result is asked
    for: reading ahead only saves time, so the run goes on with the same numbers."""

    def __init__(self, function: Callable[[Item], Result]) -> None:
        self._function = function
        self._pool: ThreadPoolExecutor | None = None

    def __enter__(self) -> "ReadAhead[Item, Result]":
        self._pool = ThreadPoolExecutor(max_workers=1)
        return self

    def __exit__(self, *exc) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True)

    def start(self, item: Item) -> Callable[[], Result]:
        """Start ``function(item)``; the returned call gives its result."""
        if self._pool is not None:
            try:
                return self._pool.submit(self._function, item).result
            except RuntimeError as exc:
                if "can't start new thread" not in str(exc):
                    raise
                log.info("no thread could be started to read ahead; reading in turn")
                self._pool.shutdown(wait=False, cancel_futures=True)
                self._pool = None
        return lambda: self._function(item)
