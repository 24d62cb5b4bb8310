"""A stop request from a signal, kept until the run has acted on it.

The command line's handler raises :class:`dfmp2.errors.Interrupted` at once, in whatever
Python code runs when the signal lands. If that is a weakref callback or a finalizer, Python
prints "Exception ignored in ..." and goes on, and the run would finish as if never asked to
stop. So the handler also keeps the request here, and every checkpoint of a run raises it
again (:func:`raise_if_requested`).
"""
from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator

from dfmp2.errors import Interrupted

STOPPING_SIGNALS = (signal.SIGTERM, signal.SIGINT)

_requested: Interrupted | None = None


def request(stop: Interrupted) -> Interrupted:
    """Keep ``stop`` until :func:`clear`; returns it, for the handler to raise."""
    global _requested
    _requested = stop
    return stop


def clear() -> None:
    """Forget any earlier request (a new command in the same process)."""
    global _requested
    _requested = None


def pending() -> bool:
    """Whether a signal asked to stop since :func:`clear`."""
    return _requested is not None


def requested() -> Interrupted | None:
    """The kept request as a new exception to raise, or None."""
    return None if _requested is None else Interrupted(str(_requested), _requested.exit_code)


def raise_if_requested() -> None:
    """Raise the kept request, if a signal came since :func:`clear`."""
    stop = requested()
    if stop is not None:
        raise stop


@contextlib.contextmanager
def ending_at_once() -> Iterator[None]:
    """SIGTERM and SIGINT end the process at once, as by default, while C++ code that holds
    off Python's handlers runs before anything needs saving (joining the process group: a
    rank waiting there for a killed peer kept torchrun's SIGTERM waiting for the join's
    timeout, then said the finished work was in a record it had not begun)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    handlers = {signum: signal.signal(signum, signal.SIG_DFL) for signum in STOPPING_SIGNALS}
    try:
        yield
    finally:
        for signum, handler in handlers.items():
            signal.signal(signum, handler)
