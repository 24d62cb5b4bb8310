"""Calling a function in a forked child that hands its result back, with a deadline.

A record damaged by a single byte can make libhdf5 loop forever while it reads the root's
attributes (no signal stops a process inside C code; only SIGKILL did) or crash with SIGSEGV.
Read in a child, either is a child that missed its deadline or died by a signal, and the
command says the file is damaged in one line.
"""
from __future__ import annotations

import contextlib
import faulthandler
import os
import pickle
import select
import signal
import time
from collections.abc import Callable
from typing import TypeVar

Result = TypeVar("Result")
# Reading a record takes well under a second; a slow shared disk gets ample room.
DEADLINE_SECONDS = 60.0
CHUNK_BYTES = 1 << 20


class ChildFailed(Exception):
    """The child died by a signal or missed its deadline; the text says which."""


def in_child(function: Callable[..., Result], *args, deadline: float | None = None) -> Result:
    """``function(*args)`` run in a forked child: its result, or the exception it raised
    (pickled back), or :class:`ChildFailed` when it has not ended within ``deadline``
    seconds (default :data:`DEADLINE_SECONDS`) or died by a signal. Where no child can be
    made (no ``os.fork``, or a fork refused) it runs here."""
    deadline = DEADLINE_SECONDS if deadline is None else deadline
    if not hasattr(os, "fork"):
        return function(*args)
    reading, writing = os.pipe()
    try:
        pid = os.fork()
    except OSError:
        # A process limit (EAGAIN) or strict overcommit (ENOMEM): read here, unguarded.
        os.close(reading)
        os.close(writing)
        return function(*args)
    if pid == 0:
        _child(reading, writing, function, args)
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
            os.waitpid(pid, 0)
    if not finished:
        raise ChildFailed("it did not finish within the deadline")
    # The pipe closes when the child ends: it has exited, or is exiting.
    _, status = os.waitpid(pid, 0)
    if os.WIFSIGNALED(status):
        raise ChildFailed(f"it crashed ({signal.Signals(os.WTERMSIG(status)).name})")
    outcome, value = pickle.loads(data)
    if outcome == "raised":
        raise value
    return value


def _child(reading: int, writing: int, function: Callable, args: tuple) -> None:
    """Run in the child: the parent's signal handlers (which raise in Python) are dropped,
    so that a signal ends the child as it would any program, and so is the fault handler:
    the parent says in one line what a crash here means."""
    try:
        os.close(reading)
        faulthandler.disable()
        for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(signum, signal.SIG_DFL)
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


def _read_until(reading: int, end: float) -> tuple[bytes, bool]:
    """What the child wrote, and whether it closed the pipe (ended) before ``end``."""
    chunks = []
    while True:
        left = end - time.monotonic()
        if left <= 0 or not select.select([reading], [], [], left)[0]:
            return b"".join(chunks), False
        chunk = os.read(reading, CHUNK_BYTES)
        if not chunk:
            return b"".join(chunks), True
        chunks.append(chunk)
