"""Calling a function in a forked child that hands its result back, with a deadline.

A record damaged by a single byte can make libhdf5 loop forever while it reads the root's
attributes (no signal stops a process inside C code; only SIGKILL did) or crash with SIGSEGV.
Read in a child, either is a child that missed its deadline or died by a signal, and the
command says so in one line.

The child must not outlive its deadline or its parent: a dfmp2 killed by SIGKILL (the OOM
killer, a harness's timeout) left a child looping at full CPU, holding the command's output
pipes open. It ends itself by an alarm at its deadline and, on Linux, when its parent dies.
"""
from __future__ import annotations

import contextlib
import faulthandler
import math
import os
import pickle
import select
import signal
import time
from collections.abc import Callable
from typing import TypeVar

from dfmp2.system.orphans import end_with_parent

Result = TypeVar("Result")
# Reading a record takes well under a second; a slow shared disk gets ample room.
DEADLINE_SECONDS = 60.0
CHUNK_BYTES = 1 << 20


class ChildFailed(Exception):
    """The child died by a signal or missed its deadline; the text says which."""


class ChildMissedDeadline(ChildFailed):
    """The child had not ended by its deadline: slow, or looping."""


def in_child(function: Callable[..., Result], *args, deadline: float | None = None) -> Result:
    """``function(*args)`` run in a forked child: its result, or the exception it raised
    (pickled back), or :class:`ChildFailed` when it has not ended within ``deadline``
    seconds (default :data:`DEADLINE_SECONDS`) or died by a signal. Where no child can be
    made (no ``os.fork``, or a fork refused) it runs here."""
    deadline = DEADLINE_SECONDS if deadline is None else deadline
    if not hasattr(os, "fork"):
        return function(*args)
    reading, writing = os.pipe()
    parent = os.getpid()
    try:
        pid = os.fork()
    except OSError:
        # A process limit (EAGAIN) or strict overcommit (ENOMEM): read here, unguarded.
        os.close(reading)
        os.close(writing)
        return function(*args)
    if pid == 0:
        _child(reading, writing, function, args, parent, deadline)
    os.close(writing)
    finished = False
    try:
        data, finished = _read_until(reading, time.monotonic() + deadline)
    finally:
        os.close(reading)
        if not finished:
            # The deadline, or a signal that stops this command while it waits.
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            _exit_status(pid)
    if not finished:
        raise ChildMissedDeadline(f"reading it did not finish within {deadline:.0f} s")
    # The pipe closes when the child ends: it has exited, or is exiting.
    status = _exit_status(pid)
    if status is not None and os.WIFSIGNALED(status):
        raise ChildFailed(f"it crashed ({signal.Signals(os.WTERMSIG(status)).name})")
    try:
        outcome, value = pickle.loads(data)
    except Exception:  # noqa: BLE001 - whatever a cut-off pickle raises
        # Only where its end could not be seen (SIGCHLD ignored): it died while writing.
        raise ChildFailed("it ended before handing back its result") from None
    if outcome == "raised":
        raise value
    return value


def _exit_status(pid: int) -> int | None:
    """The child's wait status; None where the system reaped it already: a dfmp2 started
    with SIGCHLD ignored (a daemon's or job runner's disposition, inherited through exec)
    has no child to wait for, and every record read as unreadable."""
    try:
        return os.waitpid(pid, 0)[1]
    except ChildProcessError:
        return None


def _child(reading: int, writing: int, function: Callable, args: tuple, parent: int,
           deadline: float) -> None:
    """Run in the child: the parent's signal handlers (which raise in Python) are dropped,
    so that a signal ends the child as it would any program, and so is the fault handler:
    the parent says in one line what a crash here means. An alarm ends it just after its
    deadline, and the death of its parent at once."""
    try:
        os.close(reading)
        faulthandler.disable()
        for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGALRM):
            signal.signal(signum, signal.SIG_DFL)
        signal.alarm(math.ceil(deadline) + 1)
        end_with_parent(parent)
        try:
            result = ("returned", function(*args))
        except Exception as exc:  # noqa: BLE001 - handed to the parent, which raises it
            result = ("raised", exc)
        try:
            data = pickle.dumps(result)
        except Exception as exc:  # noqa: BLE001 - an exception that does not pickle
            data = pickle.dumps(("raised", RuntimeError(f"{type(exc).__name__}: {exc}")))
        view = memoryview(data)
        while view:
            view = view[os.write(writing, view[:CHUNK_BYTES]):]
    finally:
        os._exit(0)


def _read_until(reading: int, end: float) -> tuple[bytearray, bool]:
    """What the child wrote, and whether it closed the pipe (ended) before ``end``; held in
    one growing buffer, not in pieces joined at the end (twice the record in memory)."""
    data = bytearray()
    while True:
        left = end - time.monotonic()
        if left <= 0 or not select.select([reading], [], [], left)[0]:
            return data, False
        chunk = os.read(reading, CHUNK_BYTES)
        if not chunk:
            return data, True
        data += chunk
