"""The `dfmp2` command line (click). Results go to stdout, progress and errors to stderr.

This is the edge of the program: it alone reads environment variables (DFMP2_REQUIRE_NKI,
DFMP2_NKI_MODE, DFMP2_DIST_TIMEOUT, the launcher's rank variables and Slurm's array variables)
and handles signals, and hands everything to the library as arguments.

``group`` holds the command group, ``options`` the option sets, ``calculate`` and ``manage`` the
commands and ``views`` what they print; ``main`` here runs the group.
"""
from __future__ import annotations

import contextlib
import faulthandler
import gc
import logging
import os
import shlex
import signal
import sys
import threading
import time

import click

# Before torch is imported: its C++ layer logs every failed try to reach rank 0 with a stack
# of fifty lines; the command says what failed in one line. Setting the variable shows them.
os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "FATAL")

# Importing the command modules registers their commands on the group.
from dfmp2.cli import calculate, frequencies, manage, properties  # noqa: F401
from dfmp2.cli.group import cli
from dfmp2.cli.options import NKI_PLATFORM_ENV
from dfmp2.entry import EXIT_SIGINT, TORCHRUN_LOCAL_RANK, later_rank_of_its_node
from dfmp2.errors import Dfmp2Error, Interrupted
from dfmp2.system import interrupts
from dfmp2.system.files import printable
from dfmp2.system.memory import limit_reached
from kernels import threads

__all__ = ["main", "cli"]

# How long a later rank of a node waits, after an input error, for the node's first rank to
# fail alike and the launcher to stop the job (imports and argument checks take 2-4 s a rank).
FIRST_RANK_GRACE_SECONDS = 20.0


def _raise_interrupted(signum: int, frame) -> None:
    # A second signal (Ctrl-C pressed again, SIGTERM then SIGINT) must not break off the
    # saving of the interrupted record that the first one started.
    if interrupts.pending():
        return
    # What the stop left behind is the record's to say (dfmp2.jobs.session): a command
    # stopped before it wrote one, or one that writes none, said its record held the work.
    stop = interrupts.request(Interrupted(
        f"terminated by signal {signal.Signals(signum).name}", 128 + signum))
    if threads.starting():
        # Raised inside Thread.start, it would break the new thread's bookkeeping.
        threads.defer(interrupts.raise_if_requested)
        return
    if interrupts.holding():
        interrupts.hold(stop)
        return
    raise stop


def _quiet_kept_interrupt(unraisable) -> None:
    """Python cannot raise a signal's exception where it landed in a weakref callback or a
    finalizer, and prints it; the request is kept and the next checkpoint raises it, so only
    other such exceptions are printed (the user gets one error line, not a traceback)."""
    if isinstance(unraisable.exc_value, Interrupted):
        return
    sys.__unraisablehook__(unraisable)


class _PrintableFormatter(logging.Formatter):
    """Log lines whose file names cannot act on the terminal or forge another line (control
    characters and line breaks escaped; a traceback after the message keeps its lines)."""

    def formatMessage(self, record: logging.LogRecord) -> str:
        # A library's message that ends its own line (geomeTRIC's do) ends here without a
        # visible \n.
        return printable(super().formatMessage(record).rstrip("\r\n"), one_line=True)

    def format(self, record: logging.LogRecord) -> str:
        return printable(super().format(record))


def _fail(message: str, exit_code: int) -> None:
    """Exit with ``exit_code`` after one ``Error:`` line, which a later rank of a node leaves
    to the node's first rank when that rank says the same: the ranks of a node read the same
    arguments, files and environment and get the same signals. An interruption (128 + N)
    reaches the first rank too, so a later rank just exits. After an input error (status 2)
    a later rank of torchrun's waits FIRST_RANK_GRACE_SECONDS: the first rank, failing alike,
    ends the job meanwhile (torchrun then stops the others, and this rank exits quietly); a
    rank still running after it failed alone, and prints its error. (srun lets the other
    tasks run on, so its ranks print at once.) Any other failure is printed at once."""
    if exit_code > 128 and later_rank_of_its_node(os.environ):
        sys.exit(exit_code)
    if exit_code == 2 and later_rank_of_its_node(os.environ, (TORCHRUN_LOCAL_RANK,)):
        try:
            time.sleep(FIRST_RANK_GRACE_SECONDS)
        except Interrupted as stop:
            sys.exit(stop.exit_code)
    click.echo(f"Error: {printable(message, one_line=True)}", err=True)
    sys.exit(exit_code)


def main(argv: list[str] | None = None, prog_name: str | None = None) -> None:
    """Entry point: one ``Error:`` line and status 2 for bad usage or input, 1 for failures,
    128 + N after signal N."""
    if argv is None:
        # The program's own process (callers in Python pass argv): the objects imported so far
        # (torch's and PySCF's, about 200,000) live to the end, so leave them out of every
        # garbage collection, the ones at exit included: 0.3-0.4 s less per command (measured).
        gc.freeze()
        # A crash inside a C extension (torch, h5py, libgomp) then prints where every thread
        # was: one CI run died by SIGSEGV after its error line and left nothing to go on.
        faulthandler.enable()
    args = sys.argv[1:] if argv is None else list(argv)
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(_PrintableFormatter("dfmp2: %(levelname)s: %(message)s"))
    logging.basicConfig(level=logging.WARNING, handlers=[handler])
    # A file name that is not UTF-8 (kept by Python as surrogate escapes) is printed as \xNN
    # rather than ending a finished run in UnicodeEncodeError under a strict locale.
    with contextlib.suppress(AttributeError, ValueError):
        sys.stdout.reconfigure(errors="backslashreplace")
    os.environ.setdefault(NKI_PLATFORM_ENV, "trn1")
    handled = interrupts.handled_signals()
    interrupts.clear()
    in_main_thread = threading.current_thread() is threading.main_thread()
    if in_main_thread:
        threads.guard_thread_starts()
    previous = {s: signal.signal(s, _raise_interrupted) for s in handled} if in_main_thread else {}
    previous_hook, sys.unraisablehook = sys.unraisablehook, _quiet_kept_interrupt
    try:
        code = cli.main(args=args, prog_name=prog_name or "dfmp2", standalone_mode=False,
                        obj={"command": shlex.join(["dfmp2", *args])})
    except (click.exceptions.Abort, KeyboardInterrupt):
        _fail("interrupted", EXIT_SIGINT)
    except click.ClickException as exc:
        _fail(exc.format_message(), exc.exit_code)
    except Dfmp2Error as exc:
        _fail(str(exc), exc.exit_code)
    except Exception:
        # A signal's exception caught where it landed by code that then failed in another
        # way (PySCF's basis loader tries other names): the command was stopped, not broken.
        stop = interrupts.requested()
        if stop is not None:
            _fail(str(stop), stop.exit_code)
        # Before a job's record exists (reading the molecule, a benchmark's fork), the
        # process's limits still end the command in one line.
        limit = limit_reached(sys.exc_info()[1])
        if limit is not None:
            _fail(limit, 1)
        raise
    finally:
        sys.unraisablehook = previous_hook
        # The command has answered any signal: a caller that goes on (a test, a notebook)
        # must not find the request in its next run that does not start here.
        interrupts.clear()
        # After the command, this process only exits: a signal then would land in torch's
        # exit callbacks (a KeyboardInterrupt traceback), or end by the signal a command that
        # finished and printed its result, which a job script would take for a stopped one.
        for signum, handler in previous.items():
            signal.signal(signum, signal.SIG_IGN if argv is None else handler)
    sys.exit(code if isinstance(code, int) else 0)
