"""Errors a user can act on: each carries its exit status and a one-line message."""
from __future__ import annotations


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

    # The kernels' fallback policy lets it through: a stop that lands inside an NKI kernel is
    # not that kernel failing, to be counted as a fallback and rerun on torch.
    stops_run = True

    def __init__(self, message: str, exit_code: int) -> None:
        super().__init__(message)
        self.exit_code = exit_code

    def __reduce__(self):
        # Pickled from a benchmark's side process: without its exit code it did not load,
        # and the pool waiting for the result hung.
        return type(self), (str(self), self.exit_code)
