"""What the commands print on stdout: text reports and ``--json`` / ``--qcschema`` objects."""
from __future__ import annotations

import json
from pathlib import Path
from types import ModuleType

import click

from dfmp2.errors import RunFailure
from dfmp2.input.settings import RunSettings
from dfmp2.jobs import batch, compare, interaction, optimize
from dfmp2.jobs.run import RunOutcome
from dfmp2.records import report
from dfmp2.records.properties_section import properties_json
from dfmp2.records.sections import ScfSection
from dfmp2.records.tree import (FREQUENCIES_SCHEMA, INTERACTION_SCHEMA, OPTIMIZE_SCHEMA,
                                SCHEMA, Node, schema, status)
from dfmp2.system.files import printable


def emit(text: str) -> None:
    """One piece of a command's result on stdout. A stdout that cannot take it (a full
    disk, a failing device) is a failed command, in one line; a closed pipe is not reported
    (its reader wanted no more)."""
    try:
        click.echo(text)
    except BrokenPipeError:
        raise
    except OSError as exc:
        raise RunFailure(f"cannot write the result to standard output: "
                         f"{exc.strerror or exc}") from None


def print_outcome(outcome: RunOutcome, as_json: bool) -> None:
    """A finished run's summary on stdout: one JSON object, or the text report."""
    if as_json:
        emit(json.dumps(report.json_summary(outcome.record, str(outcome.path))))
    else:
        emit(printable(report.summary(outcome.record)))
        emit(f"\nrecord written to {printable(str(outcome.path), one_line=True)}")


def print_properties(record: Node, path: Path, as_json: bool) -> None:
    """A finished properties run on stdout: its ``--json`` object, or the text report."""
    if as_json:
        summary = properties_json(record)
        # A dipole of an unstable or spin-contaminated reference is questionable: say so, as
        # run's, gradient's and frequencies' --json do.
        scf = ScfSection.read(record)
        trust = {} if scf is None else report.reference_trust(scf)
        emit(json.dumps({**summary, **trust, "record": str(path), "status": status(record)}))
    else:
        emit(printable(report.summary(record)))
        emit(f"\nrecord written to {printable(str(path), one_line=True)}")


def qcschema_module() -> ModuleType:
    """:mod:`dfmp2.interfaces.qcschema`, or a usage error saying how to install what it needs."""
    try:
        from dfmp2.interfaces import qcschema
    except ImportError as exc:
        raise click.UsageError(f"--qcschema needs qcelemental ({exc.msg}); install it with "
                               "pip install 'dfmp2[qcschema]'") from None
    return qcschema


def print_qcschema(qcschema: ModuleType, settings: RunSettings, outcome: RunOutcome,
                   version: str | None) -> None:
    """A finished run as a QCSchema AtomicResult of ``version`` (default: the module's)."""
    result = qcschema.atomic_result(qcschema.run_input(settings, outcome.record),
                                    outcome.record, outcome.path)
    emit(qcschema.serialized(result, int(version or qcschema.DEFAULT_PRINTED_VERSION)))


def print_record(root: Node, show_all: bool) -> None:
    """A record's summary, or every attribute and dataset when asked or when the summary cannot
    read it (another schema)."""
    summaries = {INTERACTION_SCHEMA: interaction.summary, OPTIMIZE_SCHEMA: optimize.summary,
                 SCHEMA: report.summary, FREQUENCIES_SCHEMA: report.summary}
    summarize = None if show_all else summaries.get(schema(root))
    text = report.dump(root) if summarize is None else summarize(root)
    emit(printable(text))


def print_batch(rows: list[dict], summaries: list[Path], as_json: bool) -> None:
    """A batch's summary rows, and where their CSV and JSON copies were written (none: they
    could not be)."""
    shown = (", ".join(printable(str(path), one_line=True) for path in summaries)
             or "not written")
    emit(json.dumps(rows, default=str) if as_json else
               f"{printable(batch.format_table(rows))}\n\nsummary: {shown}")


def print_comparison(pairs: list[tuple[compare.Row, compare.Row | None]], as_json: bool) -> None:
    """Records' energies side by side, each with its difference from the record it is compared
    against (none for the reference itself)."""
    if as_json:
        emit(json.dumps([{"record": row.label, "basis": row.basis,
                                "auxbasis": row.auxbasis, "kernels": row.kernels,
                                "e_scf": row.e_scf,
                                "e_corr": row.e_corr, "e_tot": row.e_tot,
                                "against": against.label if against else None,
                                "delta_e_corr": row.e_corr - against.e_corr if against else None,
                                "delta_e_tot": row.e_tot - against.e_tot if against else None,
                                "differs_in": compare.differences(row, against)}
                               for row, against in pairs], allow_nan=False))
    else:
        emit(printable(compare.format_table(pairs)))
