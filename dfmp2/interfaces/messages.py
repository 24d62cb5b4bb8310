"""Error messages of the Python interfaces in the caller's words. The jobs' messages name
the command line's options (``lower --frozen``) and, in a note, the record; the ASE
calculator and the QCSchema harness take other names, and their record may live in a
scratch folder that is gone when the caller reads the message."""
from __future__ import annotations

import contextlib
import re
from collections.abc import Callable, Iterator
from pathlib import Path

from dfmp2.errors import Dfmp2Error

COMMAND_LINE_OPTION = re.compile(r"(?<![\w-])(?:--([a-z][a-z0-9-]*)|-o\b)")


@contextlib.contextmanager
def interface_errors(record: Path | None, temporary: bool,
                     spelling: Callable[[str], str | None]) -> Iterator[None]:
    """Errors of the job inside name each command-line option as ``spelling`` gives it (the
    option without its dashes; ``None`` keeps the option) and, when ``temporary``, do not
    send the caller to the record."""
    try:
        yield
    except Dfmp2Error as exc:
        if exc.args:
            message = str(exc)
            if temporary and record is not None:
                message = message.replace(f" (record {record})", "")
            # -o is --output's short form.
            message = COMMAND_LINE_OPTION.sub(
                lambda match: spelling(match.group(1) or "output") or match.group(0), message)
            exc.args = (message, *exc.args[1:])
        raise
