"""Room on disk for the files a run will write, checked before it writes them.

A full disk in the middle of an HDF5 write can take the process down inside the HDF5 library
(a segfault PySCF's integral file has shown), so the large files are checked against the free
space of their folder and the process's own file-size limit (``ulimit -f``) first.
"""
from __future__ import annotations

import math
import resource
import shutil
from pathlib import Path

from dfmp2.errors import RunFailure
from dfmp2.system.memory import format_size


def writable_bytes(folder: Path) -> float:
    """The largest file this process could write in ``folder`` now."""
    free = shutil.disk_usage(folder).free
    limit, _ = resource.getrlimit(resource.RLIMIT_FSIZE)
    return min(free, math.inf if limit == resource.RLIM_INFINITY else limit)


def check_space(folder: Path, nbytes: int, what: str) -> None:
    room = writable_bytes(folder)
    if nbytes > room:
        raise RunFailure(f"not enough disk space in {folder} for {what}: it needs "
                         f"{format_size(nbytes)} and {format_size(room)} can be written; "
                         "free some space, raise --memory to keep it in memory, or choose "
                         "another --scratch")
