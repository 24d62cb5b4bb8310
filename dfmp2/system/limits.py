"""Limits of this process below the machine's: its control groups' (memory, CPU quota) and
its address space's.

A batch scheduler (Slurm's ``--mem``, a container's memory and CPU limits) confines a job to
control groups whose limits /proc/meminfo and the CPU affinity mask do not show. The kernel
enforces a memory limit by killing the job (SIGKILL: nothing saved, no error line), so a
default budget taken from the node's free memory plans tensors the job may not hold; and a
CPU quota throttles a job that runs more threads than it allows. These functions read, for
this process's group and each group above it, cgroup v2's ``memory.max``,
``memory.current`` and ``cpu.max``, or cgroup v1's ``memory.limit_in_bytes``,
``memory.usage_in_bytes``, ``cpu.cfs_quota_us`` and ``cpu.cfs_period_us``; and ``ulimit -v``
(RLIMIT_AS, whose excess fails allocations).

A group's memory use counts page cache; its inactive file pages (``inactive_file`` in
``memory.stat``) are reclaimed before the limit kills anyone, so they count as free, as
container runtimes count a working set.
"""
from __future__ import annotations

import errno
import resource
from pathlib import Path

PROC_CGROUP = Path("/proc/self/cgroup")
PROC_STATUS = Path("/proc/self/status")
CGROUP_ROOT = Path("/sys/fs/cgroup")
# cgroup v1 writes "no limit" as the largest page-aligned counter, 2^63 - 4096 here.
NO_V1_LIMIT = 2**62
# (limit, use, inactive file pages in memory.stat) of each cgroup version.
V2_FILES = ("memory.max", "memory.current", "inactive_file")
V1_FILES = ("memory.limit_in_bytes", "memory.usage_in_bytes", "total_inactive_file")


def _text(path: Path) -> str:
    try:
        return path.read_text(encoding="ascii").strip()
    except (OSError, UnicodeDecodeError):
        return ""


def _number(path: Path) -> int | None:
    text = _text(path)
    return int(text) if text.isdigit() else None


def _stat(path: Path, key: str) -> int:
    for line in _text(path).splitlines():
        name, _, value = line.partition(" ")
        if name == key and value.strip().isdigit():
            return int(value)
    return 0


def _groups(controller: str) -> list[tuple[int, Path]]:
    """(cgroup version, folder) of this process's group and of each group above it, in every
    hierarchy that holds ``controller`` (v2's one hierarchy holds them all)."""
    try:
        lines = PROC_CGROUP.read_text(encoding="ascii").splitlines()
    except (OSError, UnicodeDecodeError):
        return []
    groups = []
    for line in lines:
        hierarchy, controllers, path = (line.split(":", 2) + ["", ""])[:3]
        if hierarchy == "0" and controllers == "":
            version, root = 2, CGROUP_ROOT
        elif controller in controllers.split(","):
            version, root = 1, CGROUP_ROOT / controllers
        else:
            continue
        node = root / path.strip().lstrip("/")
        while True:
            groups.append((version, node))
            if node == root or node == node.parent:
                break
            node = node.parent
    return groups


def cgroup_headroom() -> tuple[int, int] | None:
    """(what this process may still allocate, the limit that sets it) under the tightest
    memory limit of its control groups; None without a limit."""
    tightest = None
    for version, node in _groups("memory"):
        limit_file, use_file, inactive_key = V2_FILES if version == 2 else V1_FILES
        limit, used = _number(node / limit_file), _number(node / use_file)
        if limit is not None and used is not None and limit < NO_V1_LIMIT:
            working = max(used - _stat(node / "memory.stat", inactive_key), 0)
            room = max(limit - working, 0)
            if tightest is None or room < tightest[0]:
                tightest = (room, limit)
    return tightest


def cpu_quota_cores() -> int | None:
    """The whole CPUs the tightest CPU quota of this process's control groups allows (at
    least one), or None without a quota."""
    tightest = None
    for version, node in _groups("cpu"):
        if version == 2:
            quota, _, period = _text(node / "cpu.max").partition(" ")
        else:
            quota, period = _text(node / "cpu.cfs_quota_us"), _text(node / "cpu.cfs_period_us")
        if quota.isdigit() and period.strip().isdigit() and int(period) > 0:
            cores = max(1, int(quota) // int(period))
            tightest = cores if tightest is None else min(tightest, cores)
    return tightest


def address_space_headroom() -> int | None:
    """What this process may still map under ``ulimit -v``, or None without one."""
    soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    if soft == resource.RLIM_INFINITY:
        return None
    mapped = 0
    try:
        for line in PROC_STATUS.read_text(encoding="ascii").splitlines():
            if line.startswith("VmSize:"):
                mapped = int(line.split()[1]) * 1024
    except (OSError, UnicodeDecodeError, ValueError, IndexError):
        pass
    return max(soft - mapped, 0)


def process_limit_reached(exc: BaseException) -> bool:
    """Whether ``exc`` says no thread or process could be started: Python's RuntimeError
    "can't start new thread", or fork's EAGAIN (a process limit: ``ulimit -u``, a container's
    or control group's ``pids.max``)."""
    if isinstance(exc, RuntimeError) and "can't start new thread" in str(exc):
        return True
    return isinstance(exc, BlockingIOError) and exc.errno == errno.EAGAIN


PROCESS_LIMIT_MESSAGE = ("cannot start another thread or process: this job's process limit "
                         "is reached (ulimit -u, or its container's or control group's pids "
                         "limit); raise it, or run with --threads 1")
