"""A stop request from a signal, kept until the run has acted on it.

The command line's handler raises :class:`dfmp2.errors.Interrupted` at once, in whatever
Python code runs when the signal lands. If that is a weakref callback or a finalizer, Python
prints "Exception ignored in ..." and goes on, and the run would finish as if never asked to
stop. So the handler also keeps the request here, and every checkpoint of a run raises it
again (:func:`raise_if_requested`).
"""
from __future__ import annotations

from dfmp2.errors import Interrupted

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
