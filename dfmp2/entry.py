"""The `dfmp2` program's entry point (the console script and ``python -m dfmp2``).

Importing the command line brings in torch and PySCF, about two seconds in which the
command's own signal handling is not yet installed. This module imports nothing heavy, and
guards that import, so that a Ctrl-C or a SIGTERM in those seconds ends the program with one
line and status 130 or 143, as it does later, instead of a KeyboardInterrupt traceback from
deep inside an import or a silent death by the signal.
"""
from __future__ import annotations

import signal
import sys

EXIT_SIGINT = 128 + signal.SIGINT


class StoppedWhileStarting(BaseException):
    """A SIGTERM while the command line is being imported (a BaseException: library code that
    catches Exception must not swallow it)."""


def _stop(signum: int, frame) -> None:
    raise StoppedWhileStarting(signum)


def main() -> None:
    previous = signal.signal(signal.SIGTERM, _stop)
    try:
        from dfmp2.cli import main as run_command_line
    except (KeyboardInterrupt, StoppedWhileStarting) as stop:
        signum = stop.args[0] if isinstance(stop, StoppedWhileStarting) else signal.SIGINT
        print(f"Error: {signal.Signals(signum).name} while starting; nothing was run",
              file=sys.stderr)
        sys.exit(128 + signum)
    finally:
        signal.signal(signal.SIGTERM, previous)
    run_command_line(prog_name="dfmp2")
