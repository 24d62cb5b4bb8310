"""A stop request from a signal, kept until the run has acted on it.

The command line's handler raises :class:`dfmp2.errors.Interrupted` at once, in whatever
Python code runs when the signal lands. If that is a weakref callback or a finalizer, Python
prints "Exception ignored in ..." and goes on, and the run would finish as if never asked to
stop. So the handler also keeps the request here, and every checkpoint of a run raises it
again (:func:`raise_if_requested`).

A change of the record made in several steps (a checkpoint's pairs and their sums) must not
be cut between them: the stopping run saves the record as it is, and a checkpoint of 12
pairs and 11 sums could not be resumed. Such changes are written under :func:`written_whole`:
a signal that lands inside is held and raised when the change is complete.
"""
from __future__ import annotations

import contextlib
import functools
import signal
import threading
from collections.abc import Callable, Iterator
from typing import TypeVar

from dfmp2.errors import Interrupted

# SIGHUP (the terminal or SSH session of a run started in it closed) stops a run as SIGTERM
# does, saving what is finished, unless the run was started ignoring it (nohup).
STOPPING_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)

_requested: Interrupted | None = None
# How many written_whole changes the main thread is inside, and a stop that landed in one.
_depth = 0
_held: Interrupted | None = None
Writer = TypeVar("Writer", bound=Callable)


def request(stop: Interrupted) -> Interrupted:
    """Keep ``stop`` until :func:`clear`; returns it, for the handler to raise."""
    global _requested
    _requested = stop
    return stop


def clear() -> None:
    """Forget any earlier request (a new command in the same process)."""
    global _requested, _held
    _requested = _held = None


def holding() -> bool:
    """Whether the main thread is inside a :func:`written_whole` change."""
    return _depth > 0


def hold(stop: Interrupted) -> None:
    """Keep ``stop`` to raise when the change under way is complete."""
    global _held
    _held = stop


@contextlib.contextmanager
def signals_held() -> Iterator[None]:
    """The body runs to its end even if a stop is requested meanwhile; the stop is raised
    after it. Only the main thread receives signals, so elsewhere this does nothing."""
    global _depth, _held
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    _depth += 1
    try:
        yield
    finally:
        _depth -= 1
        # Taken even when the body failed: guarded() then finds the request itself.
        stop = _held if _depth == 0 else None
        if stop is not None:
            _held = None
    if stop is not None:
        raise stop


@contextlib.contextmanager
def raised_at_once() -> Iterator[None]:
    """A stop that lands in the body is raised there, even inside a caller's
    :func:`signals_held`, and one that caller holds already is raised on entry: a batch holds
    stops while it finds out whether a molecule needs computing (a skip is nothing else) and
    while it reports on it, but the calculation stops at once, as a run's does."""
    global _depth, _held
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    outer, _depth = _depth, 0
    try:
        if _held is not None:
            stop, _held = _held, None
            raise stop
        yield
    finally:
        _depth = outer


def written_whole(writer: Writer) -> Writer:
    """``writer`` (a change of the record in memory) under :func:`signals_held`."""
    @functools.wraps(writer)
    def whole(*args, **kwargs):
        with signals_held():
            return writer(*args, **kwargs)
    return whole


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


def handled_signals() -> list[int]:
    """The stopping signals this process takes: all but a SIGHUP it was started ignoring."""
    return [signum for signum in STOPPING_SIGNALS
            if signum != signal.SIGHUP or signal.getsignal(signum) != signal.SIG_IGN]


@contextlib.contextmanager
def ending_at_once() -> Iterator[None]:
    """The stopping signals end the process at once, as by default, while C++ code that holds
    off Python's handlers runs before anything needs saving (joining the process group: a
    rank waiting there for a killed peer kept torchrun's SIGTERM waiting for the join's
    timeout, then said the finished work was in a record it had not begun)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    handlers = {signum: signal.signal(signum, signal.SIG_DFL) for signum in handled_signals()}
    try:
        yield
    finally:
        for signum, handler in handlers.items():
            signal.signal(signum, handler)
