"""The `dfmp2` program's entry point (the console script and ``python -m dfmp2``).

Importing the command line brings in torch and PySCF, about two seconds in which the
command's own signal handling is not yet installed. This module imports nothing heavy, so
that a Ctrl-C in those seconds ends the program with one line and status 130, as it does
later, instead of a KeyboardInterrupt traceback from deep inside an import.
"""
from __future__ import annotations

import signal
import sys

EXIT_SIGINT = 128 + signal.SIGINT


def main() -> None:
    try:
        from dfmp2.cli import main as run_command_line
    except KeyboardInterrupt:
        print("Error: interrupted while starting; nothing was run", file=sys.stderr)
        sys.exit(EXIT_SIGINT)
    run_command_line(prog_name="dfmp2")
