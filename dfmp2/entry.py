"""The `dfmp2` program's entry point (the console script and ``python -m dfmp2``).

Importing the command line brings in torch and PySCF, about two seconds in which the
command's own signal handling is not yet installed. This module imports nothing heavy, and
guards that import, so that a Ctrl-C, a SIGTERM or a SIGHUP in those seconds ends the
program with one line and status 130, 143 or 129, as it does later, instead of a
KeyboardInterrupt traceback from deep inside an import or a silent death by the signal.

It also reads the environment variables those imports read before they do: each copy of
libgomp (torch's and PySCF's) would print its own complaint about an OMP_NUM_THREADS it
cannot use, and then ignore it; PySCF's import would end in a ValueError traceback on a
PYSCF_MAX_MEMORY that is not a whole number.
"""
from __future__ import annotations

import os
import re
import resource
import signal
import sys
import traceback
from pathlib import Path

from dfmp2.system.interrupts import handled_signals

EXIT_SIGINT = 128 + signal.SIGINT
# What libgomp accepts: positive thread counts, one per nesting level, separated by commas.
OPENMP_THREADS = re.compile(r"\s*[0-9]+\s*(,\s*[0-9]+\s*)*")
# A process's rank on its node: torchrun's, then srun's; and, as
# dfmp2.system.distributed.launch_from reads a launch, the variable that gives its rank in
# the whole launch and the one that says how many processes it started.
TORCHRUN_LOCAL_RANK = "LOCAL_RANK"
LOCAL_RANKS = (TORCHRUN_LOCAL_RANK, "SLURM_LOCALID")
LAUNCHES = {TORCHRUN_LOCAL_RANK: ("RANK", "WORLD_SIZE"),
            "SLURM_LOCALID": ("SLURM_PROCID", "SLURM_STEP_NUM_TASKS")}


def _stop(signum: int, frame) -> None:
    """A signal while the command line is being imported: nothing has run, so the program
    ends here. Raising instead, at whatever bytecode the signal landed on, could leave numpy
    half-imported, and the next access recursed into a 46-line RecursionError, exit 1. A
    later rank of a node ends without a line: the node's first rank got the signal too."""
    if not later_rank_of_its_node(os.environ):
        sys.stderr.write(f"Error: {signal.Signals(signum).name} while starting; nothing was "
                         "run\n")
        sys.stderr.flush()
    os._exit(128 + signum)


def later_rank_of_its_node(environ, names: tuple[str, ...] = LOCAL_RANKS) -> bool:
    """Whether a launcher started this process as a rank other than the first of its node
    (by default torchrun's LOCAL_RANK or srun's SLURM_LOCALID), in a launch of several
    processes that dfmp2 runs as one (its rank and size set, as
    :func:`dfmp2.system.distributed.launch_from` requires): a LOCAL_RANK left over in a
    shell, alone or beside a WORLD_SIZE, made a lone run keep quiet on a signal and wait 20 s
    before saying what was wrong with its input."""
    return any(_whole_number(environ, name) > 0 and LAUNCHES[name][0] in environ
               and _whole_number(environ, LAUNCHES[name][1]) > 1 for name in names)


def _whole_number(environ, name: str) -> int:
    """The variable as a whole number; 0 when unset or not one."""
    try:
        return int(environ.get(name, "0").strip())
    except ValueError:
        return 0


def openmp_thread_counts(value: str) -> list[int] | None:
    """The thread counts of an OMP_NUM_THREADS value, one per nesting level; None when
    OpenMP would reject it."""
    if not OPENMP_THREADS.fullmatch(value):
        return None
    counts = [int(count) for count in value.split(",")]
    return counts if all(0 < count < 2**63 for count in counts) else None


def drop_invalid_openmp_threads(environ=os.environ) -> str | None:
    """Remove an OMP_NUM_THREADS that the OpenMP runtime would reject (and then ignore), and
    return the warning that says so; None when it is absent or valid."""
    value = environ.get("OMP_NUM_THREADS")
    if value is None or openmp_thread_counts(value) is not None:
        return None
    del environ["OMP_NUM_THREADS"]
    return (f"OMP_NUM_THREADS={value!r} is not a positive number of threads and is ignored; "
            "unset it or give one such as 2")


def drop_invalid_pyscf_memory(environ=os.environ) -> str | None:
    """Remove a PYSCF_MAX_MEMORY that PySCF cannot read as whole megabytes (its import would
    fail on it), and return the warning that says so; None when it is absent or valid."""
    value = environ.get("PYSCF_MAX_MEMORY")
    if value is None:
        return None
    try:
        int(value)
        return None
    except ValueError:
        del environ["PYSCF_MAX_MEMORY"]
    return (f"PYSCF_MAX_MEMORY={value!r} is not a whole number of megabytes and is ignored; "
            "unset it or give one such as 4000")


def open_closed_standard_streams() -> None:
    """Put /dev/null on standard input, output or error where the program was started with
    it closed (``2>&-``): Python leaves ``sys.stderr`` None, where progress and log messages
    go, and the next file opened (a record) would take descriptor 2, where libraries write
    their complaints."""
    for fd, name, mode in ((0, "stdin", "r"), (1, "stdout", "w"), (2, "stderr", "w")):
        try:
            os.fstat(fd)
            continue
        except OSError:
            pass
        null = os.open(os.devnull, os.O_RDWR)
        if null != fd:
            os.dup2(null, fd)
            os.close(null)
        if getattr(sys, name) is None:
            setattr(sys, name, open(fd, mode, closefd=False))


def main() -> None:
    open_closed_standard_streams()
    for invalid in (drop_invalid_openmp_threads(), drop_invalid_pyscf_memory()):
        if invalid is not None:
            print(f"dfmp2: WARNING: {invalid}", file=sys.stderr)
    try:
        os.getcwd()
    except FileNotFoundError:
        # MKL's loader then fails inside torch's import with a line that blames the install.
        _refuse("the current folder no longer exists (it was deleted or moved); change to an "
                "existing folder and run again")
    previous = {signum: signal.signal(signum, _stop) for signum in handled_signals()}
    try:
        from dfmp2.cli import main as run_command_line
    except Exception as exc:
        problem = import_problem(exc)
        if problem is None:
            raise
        _refuse(problem)
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    run_command_line(prog_name="dfmp2")


def _refuse(problem: str) -> None:
    sys.stderr.write(f"Error: {problem}\n")
    sys.stderr.flush()
    sys.exit(2)


def import_problem(exc: Exception) -> str | None:
    """What the user can mend when importing the command line (torch, PySCF) failed with
    ``exc``: PySCF's configuration file, which its import runs, failing; or an address-space
    limit (``ulimit -v``) too small to load the libraries. None for anything else (a bug or a
    broken installation, whose traceback is then the useful report)."""
    frames = traceback.extract_tb(exc.__traceback__)
    if any(Path(frame.filename).parts[-2:] == ("pyscf", "__config__.py") for frame in frames):
        return (f"PySCF's configuration file {pyscf_config_file()} fails to run "
                f"({_named(exc)}); mend it, or set PYSCF_CONFIG_FILE to another")
    limit, _ = resource.getrlimit(resource.RLIMIT_AS)
    if (isinstance(exc, (MemoryError, ImportError, OSError, SystemError))
            and limit != resource.RLIM_INFINITY):
        return (f"torch and PySCF cannot be loaded within this process's address-space limit "
                f"(ulimit -v {limit // 1024} kB): {_named(exc)}; raise the limit "
                "(loading them alone maps about 1 GB)")
    return None


def _named(exc: Exception) -> str:
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


def pyscf_config_file() -> str:
    """The configuration file PySCF's import runs: PYSCF_CONFIG_FILE's, else .pyscf_conf.py
    in the current folder, else in the home folder (PySCF's own order)."""
    for candidate in (os.environ.get("PYSCF_CONFIG_FILE"),
                      os.path.join(os.path.abspath("."), ".pyscf_conf.py"),
                      os.path.join(os.environ.get("HOME", "."), ".pyscf_conf.py")):
        if candidate is not None and os.path.isfile(candidate):
            return candidate
    return "(not found)"
