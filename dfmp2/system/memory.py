"""Memory sizes: parsing ``--memory``, choosing a safe default, and the one place that says
which share of the budget each large tensor may take and still stay in memory."""
from __future__ import annotations

import logging
import math
import os
import re
import resource

from dfmp2.errors import InputError
from dfmp2.system.limits import (PROCESS_LIMIT_MESSAGE, address_space_headroom,
                                 cgroup_headroom, process_limit_reached)

log = logging.getLogger(__name__)

UNITS = {"": 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12,
         "KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40}
# Leave room for PySCF, the interpreter and the OS when no budget is given.
DEFAULT_FRACTION_OF_AVAILABLE = 0.6
# Address space a run maps beyond its budget once the libraries are loaded: OpenBLAS's 32 MiB
# buffer for its first product (the SCF's guess), thread stacks, the record's HDF5 library
# state. Under a ``ulimit -v`` that left 62 MB, water/cc-pVDZ crashed (SIGSEGV) inside that
# first product; with 165 MB it ran.
MIN_ADDRESS_SPACE_HEADROOM = 128 * 2**20
# Sizes are stored as signed 64-bit integers (HDF5 attributes, PySCF's max_memory arithmetic).
MAX_BYTES = 2**63 - 1
# Every size estimate counts fp64 numbers: the tensors are stored in fp64 whatever the kernels'
# precision.
FP64_BYTES = 8

# In-memory shares: a tensor stays in memory while it takes at most this share of the budget;
# beyond it, it goes to a scratch file. Each share leaves the rest of the budget to the work
# blocks of the step that uses the tensor.
# MP2's fitted tensor B: the other half is for the integral blocks of its build and the
# (ia|jb) blocks of the energy step, which grow with the occupied block.
B_IN_MEMORY_SHARE = 0.5
# Our JK-fit tensor: the remaining 30% is split between the J/K build's work buffers
# (KernelDF.build) and the SCF's own matrices, which are small next to the tensor.
JK_TENSOR_IN_MEMORY_SHARE = 0.7
# PySCF's JK-fit tensor: PySCF's own rule (pyscf.df.DF.build keeps it in memory only while it
# takes less than 90% of max_memory, a strict test); at and above it we name its file, so that
# it lands in our scratch folder rather than PySCF's TMPDIR.
PYSCF_JK_IN_MEMORY_SHARE = 0.9
# The gradient's B, Gamma and the JK pass's half-transformed integrals: the other half is for
# the amplitude sweep's slabs and the auxiliary blocks of the derivative-integral sweeps.
GRADIENT_TENSORS_IN_MEMORY_SHARE = 0.5


def fits_in_memory(nbytes: float, budget: float, share: float) -> bool:
    """Whether a tensor of ``nbytes`` stays in memory under ``budget``, given its share."""
    return nbytes <= share * budget


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
    """Memory this process can have now: the system's (MemAvailable, or total RAM if
    unknown), within what its control group's limit and ``ulimit -v`` leave it."""
    free = physical_bytes()
    try:
        with open("/proc/meminfo", encoding="ascii") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    free = int(line.split()[1]) * 1024
    except OSError:
        pass
    group = cgroup_headroom()
    rooms = [free, address_space_headroom(), None if group is None else group[0]]
    return min(room for room in rooms if room is not None)


def memory_budget(memory: int | None) -> int:
    """The budget of a calculation: ``memory`` bytes (checked), else a share of the memory
    available now."""
    mappable = address_space_headroom()
    if mappable is not None and mappable < MIN_ADDRESS_SPACE_HEADROOM:
        limit, _ = resource.getrlimit(resource.RLIMIT_AS)
        raise InputError(f"only {format_size(mappable)} of address space is left under this "
                         f"process's limit (ulimit -v {limit // 1024} kB) once torch and PySCF "
                         f"are loaded, and their products need at least "
                         f"{format_size(MIN_ADDRESS_SPACE_HEADROOM)}; raise the limit")
    if memory is not None:
        installed = physical_bytes()
        group = cgroup_headroom()
        if checked_size(memory) > installed:
            log.warning("--memory %s is more than the %s of memory this machine has: plans made "
                        "for it can exhaust memory (the run is then killed); give at most what "
                        "the machine has", format_size(memory), format_size(installed))
        elif group is not None and memory > group[1]:
            log.warning("--memory %s is more than the %s memory limit of this job (its control "
                        "group's): plans made for it can exceed the limit, and the job is then "
                        "killed with nothing saved; give at most the limit",
                        format_size(memory), format_size(group[1]))
        elif mappable is not None and memory > mappable:
            log.warning("--memory %s is more than the %s this process may still map under its "
                        "address-space limit (ulimit -v): allocations beyond it fail; give at "
                        "most that, or raise the limit", format_size(memory),
                        format_size(mappable))
        return memory
    return int(available_bytes() * DEFAULT_FRACTION_OF_AVAILABLE)


def physical_bytes() -> int:
    """The machine's installed memory."""
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def format_size(nbytes: float, rounded_up: bool = False) -> str:
    """``nbytes`` to one decimal of its unit; ``rounded_up`` for a minimum, which must not
    read as a budget below it (a refused 1,010,000 bytes and a minimum of 1,031,000 both
    read 1.0 MB)."""
    for unit, scale in (("EB", 1e18), ("PB", 1e15), ("TB", 1e12), ("GB", 1e9), ("MB", 1e6),
                        ("kB", 1e3)):
        if nbytes >= scale:
            value = math.ceil(nbytes / scale * 10) / 10 if rounded_up else nbytes / scale
            return f"{value:.1f} {unit}"
    return f"{math.ceil(nbytes) if rounded_up else int(nbytes)} B"


def peak_resident_megabytes() -> float:
    """The largest resident memory this process has had, in MB (Linux counts kB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e3


OUT_OF_MEMORY_MESSAGE = ("out of memory; lower --memory so that dfmp2 plans for less, or use "
                         "a machine with more")


def limit_reached(exc: BaseException) -> str | None:
    """The one line for ``exc`` when it says the process hit a limit of its own (memory, or
    the threads and processes it may start); None for any other exception."""
    if out_of_memory(exc):
        limit, _ = resource.getrlimit(resource.RLIMIT_AS)
        if limit != resource.RLIM_INFINITY:
            # The limit, not the machine, is then what ran out most often, and the run may
            # not have been given a --memory to lower.
            return (f"out of memory within this process's address-space limit (ulimit -v "
                    f"{limit // 1024} kB); raise the limit, or lower --memory so that dfmp2 "
                    "plans for less")
        return OUT_OF_MEMORY_MESSAGE
    if process_limit_reached(exc):
        return PROCESS_LIMIT_MESSAGE
    return None


def out_of_memory(exc: BaseException) -> bool:
    """Whether ``exc`` says an allocation failed: numpy's MemoryError, or torch's, a
    RuntimeError from its CPU allocator ("can't allocate memory") or its out-of-memory error
    on a GPU."""
    import torch

    if isinstance(exc, (MemoryError, getattr(torch, "OutOfMemoryError",
                                             torch.cuda.OutOfMemoryError))):
        return True
    return isinstance(exc, RuntimeError) and "can't allocate memory" in str(exc)
