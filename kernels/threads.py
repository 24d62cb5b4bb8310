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
import threading
from collections.abc import Callable, Iterator

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
