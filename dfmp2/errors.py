"""Errors a user can act on: each carries its exit status and a one-line message."""
from __future__ import annotations

import contextlib
from pathlib import Path


class Dfmp2Error(Exception):
    """A failure reported to the user as one ``Error:`` line, without a traceback."""

    exit_code = 1


class InputError(Dfmp2Error):
    """Bad input: a file, option or combination the user must fix (exit status 2)."""

    exit_code = 2


class RunFailure(Dfmp2Error):
    """The calculation ran but could not produce a trustworthy result (exit status 1)."""

    exit_code = 1


class Interrupted(RunFailure):
    """The run was stopped by a signal (SIGTERM from a batch scheduler, or Ctrl-C). What it
    finished is in the record, which a later run resumes."""

    def __init__(self, message: str, exit_code: int) -> None:
        super().__init__(message)
        self.exit_code = exit_code


@contextlib.contextmanager
def temporary_record(path: Path, temporary: bool):
    """Errors of a job whose record lives in a scratch folder that is gone when the caller
    sees them (the ASE calculator, the QCSchema harness) do not send the user to that
    record."""
    try:
        yield
    except Dfmp2Error as exc:
        if temporary and exc.args:
            exc.args = (str(exc).replace(f" (record {path})", ""), *exc.args[1:])
        raise
