"""Memory sizes: parsing ``--memory`` and choosing a safe default."""
from __future__ import annotations

import os
import re

from dfmp2.errors import InputError

UNITS = {"": 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12,
         "KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40}
# Leave room for PySCF, the interpreter and the OS when no budget is given.
DEFAULT_FRACTION_OF_AVAILABLE = 0.6
# Sizes are stored as signed 64-bit integers (HDF5 attributes, PySCF's max_memory arithmetic).
MAX_BYTES = 2**63 - 1


def parse_size(text: str) -> int:
    """Bytes in a size such as ``4GB``, ``500MB``, ``1.5GiB`` or ``123456``."""
    match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([A-Za-z]*)\s*", text)
    unit = match.group(2).upper() if match else None
    if not match or unit not in UNITS:
        raise InputError(f"cannot read memory size {text!r}; write it like 4GB, 500MB or 2GiB")
    return checked_size(int(float(match.group(1)) * UNITS[unit]), text)


def checked_size(size: int, text: str | None = None) -> int:
    """``size`` (bytes) as a memory budget: positive, and small enough to be stored."""
    shown = repr(text if text is not None else str(size))
    if size <= 0:
        raise InputError(f"memory size {shown} must be positive")
    if size > MAX_BYTES:
        raise InputError(f"memory size {shown} is more than any machine has (the limit is "
                         f"{format_size(MAX_BYTES)}); give the memory dfmp2 may use, e.g. 4GB")
    return size


def available_bytes() -> int:
    """Memory the system can give us now (MemAvailable), or total RAM if unknown."""
    try:
        with open("/proc/meminfo", encoding="ascii") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def memory_budget(memory: int | None) -> int:
    """The budget of a calculation: ``memory`` bytes (checked), else a share of the memory
    available now."""
    if memory is not None:
        return checked_size(memory)
    return int(available_bytes() * DEFAULT_FRACTION_OF_AVAILABLE)


def format_size(nbytes: float) -> str:
    for unit, scale in (("EB", 1e18), ("PB", 1e15), ("TB", 1e12), ("GB", 1e9), ("MB", 1e6),
                        ("kB", 1e3)):
        if nbytes >= scale:
            return f"{nbytes / scale:.1f} {unit}"
    return f"{int(nbytes)} B"
