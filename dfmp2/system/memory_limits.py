"""Memory limits of this process below the machine's: its control group's and its address
space's.

A batch scheduler (Slurm's ``--mem``, a container's memory limit) confines a job to a control
group whose limit the kernel enforces by killing the job (SIGKILL: nothing saved, no error
line), while ``/proc/meminfo`` still shows the whole node. A default budget taken from the
node's free memory then plans tensors the job may not hold. These functions read what the
job may still allocate, from cgroup v2 (``memory.max``, ``memory.current``) or v1
(``memory.limit_in_bytes``, ``memory.usage_in_bytes``) for this process's group and each
group above it, and from ``ulimit -v`` (RLIMIT_AS, whose excess fails allocations).

A group's use counts page cache; its inactive file pages (``inactive_file`` in
``memory.stat``) are reclaimed before the limit kills anyone, so they count as free, as
container runtimes count a working set.
"""
from __future__ import annotations

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


def _number(path: Path) -> int | None:
    try:
        text = path.read_text(encoding="ascii").strip()
    except (OSError, UnicodeDecodeError):
        return None
    return int(text) if text.isdigit() else None


def _stat(path: Path, key: str) -> int:
    try:
        for line in path.read_text(encoding="ascii").splitlines():
            name, _, value = line.partition(" ")
            if name == key and value.strip().isdigit():
                return int(value)
    except (OSError, UnicodeDecodeError):
        pass
    return 0


def _groups() -> list[tuple[Path, Path, tuple[str, str, str]]]:
    """(hierarchy root, folder, file names) of this process's memory control group in each
    hierarchy that has one."""
    try:
        lines = PROC_CGROUP.read_text(encoding="ascii").splitlines()
    except (OSError, UnicodeDecodeError):
        return []
    groups = []
    for line in lines:
        hierarchy, controllers, path = (line.split(":", 2) + ["", ""])[:3]
        if hierarchy == "0" and controllers == "":
            root, files = CGROUP_ROOT, V2_FILES
        elif "memory" in controllers.split(","):
            root, files = CGROUP_ROOT / "memory", V1_FILES
        else:
            continue
        groups.append((root, root / path.strip().lstrip("/"), files))
    return groups


def cgroup_headroom() -> tuple[int, int] | None:
    """(what this process may still allocate, the limit that sets it) under the tightest
    memory limit of its control groups and their ancestors; None without a limit."""
    tightest = None
    for root, folder, (limit_file, use_file, inactive_key) in _groups():
        node = folder
        while True:
            limit, used = _number(node / limit_file), _number(node / use_file)
            if limit is not None and used is not None and limit < NO_V1_LIMIT:
                working = max(used - _stat(node / "memory.stat", inactive_key), 0)
                room = max(limit - working, 0)
                if tightest is None or room < tightest[0]:
                    tightest = (room, limit)
            if node == root or node == node.parent:
                break
            node = node.parent
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
