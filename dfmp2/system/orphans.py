"""A child process that must not outlive the dfmp2 that started it.

A dfmp2 killed by SIGKILL (the OOM killer, ``kill -9``, a harness's timeout) runs no cleanup,
and its children went on: a record reader looping at full CPU, or a benchmark's side
computing a whole calculation for no one, its files left in ``$TMPDIR``.
"""
from __future__ import annotations

import contextlib
import ctypes
import os
import signal

# Linux's prctl option that sends a process a signal when its parent dies.
PR_SET_PDEATHSIG = 1


def end_with_parent(parent: int) -> None:
    """Run in the child: ask Linux to kill it when its parent dies (elsewhere nothing is
    asked). A parent that died before the request was made is seen by its pid."""
    # The process's own symbols include the C library's (find_library would start ldconfig).
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None).prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent:
        os._exit(1)
