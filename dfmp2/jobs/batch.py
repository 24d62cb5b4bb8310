"""`dfmp2 batch`: many molecules, one record each, resumable and shardable.

What to run comes from :mod:`dfmp2.jobs.manifest` (XYZ files, globs and manifests). A
calculation listed twice shares one record, so it is computed once.

A line that cannot run (a missing file, an unknown option) is recorded as failed and the
batch goes on. A record that is already complete counts as done only when it was computed
with the same inputs; otherwise the molecule is recomputed and the old record is kept beside
the new one (see :mod:`dfmp2.records.checkpoint`). A molecule whose record another dfmp2 run holds
(a second batch on the same list and folder) is left to that run, and the summary reports
what its record says when the summary is written.
"""
from __future__ import annotations

import collections
import csv
import dataclasses
import io
import json
import logging
import os
import re
import time
from collections.abc import Mapping
from pathlib import Path


from dfmp2.jobs import preamble, run as run_job
from dfmp2.jobs.manifest import BatchItem, line_settings
from dfmp2.system.distributed import environment_integer
from dfmp2.errors import Dfmp2Error, InputError, Interrupted, RunFailure
from dfmp2.system import interrupts
from dfmp2.system.files import (can_create_files_in, create_folder, existing_kind,
                                printable)
from dfmp2.system.progress import Progress
from dfmp2.records.tree import (COMPLETE, FAILED, INTERACTION_SCHEMA, RUNNING, SCHEMA, Node,
                                new_record, read_record, schema, set_status, status, write_record)
from dfmp2.records.sections import CalculationInputs, CheckSection
from dfmp2.records.lock import RecordInUse, RecordLock
from dfmp2.records.report import json_summary
from dfmp2.input.basis_files import same_basis_name
from dfmp2.interfaces.messages import interface_errors
from dfmp2.input.settings import RunSettings

log = logging.getLogger(__name__)
# --shard K/N in ASCII digits.
SHARD_TEXT = re.compile(r"\s*([0-9]+)\s*/\s*([0-9]+)\s*")
SUMMARY_FIELDS = ("index", "molecule", "basis", "status", "e_scf", "e_corr", "e_tot",
                  "e_int_mp2_cp", "e_int_dh_cp", "seconds", "record", "error")
# A molecule whose record another dfmp2 run holds is left to that run: not a failure here.
RUNNING_ELSEWHERE = "running elsewhere"
# A signal stops a batch: the molecule it interrupted resumes from its record, the molecules
# after it were never started.
INTERRUPTED = "interrupted"
NOT_STARTED = "not started"
OTHER_RUN = "(other run)"
# A row's key (not written) for what tells whether a record holds its calculation.
SAME_CALCULATION = "_same_calculation"
CHECK_FAILED = "complete (check failed)"
# First characters that make a spreadsheet read a CSV cell as a formula.
FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")

# `--shard array`: the shard of this task of a Slurm array job.
ARRAY_SHARD = "array"

def parse_shard(text: str | None, environ: Mapping[str, str], rank: int = 0,
                world_size: int = 1) -> tuple[int, int]:
    """This process's shard (K, N), 0 <= K < N: the molecules K, K + N, ... The shard of the
    job is ``text`` (``K/N``), by default the task of a Slurm array job (from ``environ``),
    else 0/1; under torchrun or srun its ranks split it: rank r of R takes K + N r of N R,
    so together the ranks of a shard run its molecules, each one once, whatever number of
    ranks each shard has (K R + r of N R gave the ranks of shard 0 of 2 molecules 0, 1, 4, 5,
    ... and left 2, 6, ... to no one when shard 1 ran in one process)."""
    if text is None:
        k, n = slurm_array_shard(environ) or (0, 1)
        if n > 1:
            # Documented, but a task given a list of its own would run a part of it and
            # report success.
            log.warning("this Slurm array task runs shard %d/%d of the batch (every %s "
                        "molecule from the %s); give --shard 0/1 to run all of them", k, n,
                        ordinal(n), ordinal(k + 1))
    elif text.strip().lower() == ARRAY_SHARD:
        shard = slurm_array_shard(environ)
        if shard is None:
            raise InputError("--shard array: this is not a task of a Slurm array job "
                             "(SLURM_ARRAY_TASK_ID is not set); give --shard K/N")
        k, n = shard
    else:
        # ASCII digits only: int() reads full-width and other scripts' digits too.
        written = SHARD_TEXT.fullmatch(text)
        if written is None:
            raise InputError(f"--shard {text!r}: write it as K/N, e.g. 0/4")
        k, n = int(written[1]), int(written[2])
        if not 0 <= k < n:
            raise InputError(f"--shard {text}: K must satisfy 0 <= K < N")
    return k + n * rank, n * world_size


def ordinal(n: int) -> str:
    """1st, 2nd, 3rd, 4th, ..., 11th, 12th, 13th, ..., 21st."""
    suffix = "th" if n % 100 in (11, 12, 13) else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


def _slurm_number(environ: Mapping[str, str], name: str, default: int | None = None
                  ) -> int | None:
    return environment_integer(environ, name, default, minimum=None,
                               remedy="give the shard explicitly with --shard K/N")


def slurm_array_shard(environ: Mapping[str, str]) -> tuple[int, int] | None:
    """The shard of this task of a Slurm array job, None outside one. Task ids min, min+step,
    ..., max are shards 0 .. count-1; an array that is not such a progression (``--array=3,7,9``)
    is refused, since its tasks cannot tell which molecules the others run."""
    task = _slurm_number(environ, "SLURM_ARRAY_TASK_ID")
    if task is None:
        return None
    # Slurm sets all of them for every array task. Without MAX, an irregular array
    # (--array=0,1,2,4) passed on every task but the last, and a molecule ran nowhere.
    for name in ("SLURM_ARRAY_TASK_COUNT", "SLURM_ARRAY_TASK_MAX"):
        if _slurm_number(environ, name) is None:
            raise InputError(f"SLURM_ARRAY_TASK_ID is set but {name} is not; give the shard "
                             "explicitly with --shard K/N")
    count = _slurm_number(environ, "SLURM_ARRAY_TASK_COUNT")
    first = _slurm_number(environ, "SLURM_ARRAY_TASK_MIN", 0)
    step = _slurm_number(environ, "SLURM_ARRAY_TASK_STEP", 1)
    last = _slurm_number(environ, "SLURM_ARRAY_TASK_MAX")
    position, offset = divmod(task - first, step) if step > 0 else (-1, 0)
    # Count ids in [min, max] on the step's grid can only be the whole progression, so each
    # task can check on its own that no molecule falls between the tasks.
    if offset or not 0 <= position < count or first + (count - 1) * step != last:
        bounds = f"min {first}, step {step}, count {count}, max {last}"
        raise InputError(f"Slurm array task {task} is not at a regular position of the array "
                         f"({bounds}); give the shard explicitly with --shard K/N")
    return position, count


WILDCARDS = re.compile(r"[*?\[\]]")


def record_names(items: list[BatchItem], settings: list[RunSettings]) -> list[str]:
    """``<molecule>-<basis>[-<functional>].h5``, numbered where two different calculations
    would share a name. The same calculation listed twice (the same file, options and split,
    whatever ``HOW_IT_RUNS`` says) shares one record, so it is computed once and the second
    listing reuses it. A line that cannot run gets ``-line<N>`` after its manifest line's
    number instead (``-item<index>`` for a file given to the batch itself), and then its
    index too where two manifests' lines would share that name. A line that
    fails only when it runs is named as any other: its failure is not known here (nor on the
    other shards, which must name it alike), and mending it or its file in place then leaves
    every name as it was."""
    names = [f"{s.molecule.stem}-{s.basis_label()}{s.xc_suffix()}"
             + ("-interaction" if item.interaction is not None else "")
             for s, item in zip(settings, items)]
    identities = [_calculation(item, s) for item, s in zip(items, settings)]
    # A listing through another name of the file (a symbolic link) takes the first's name.
    first_names: dict[str, str] = {}
    for n, identity in enumerate(identities):
        if identity is not None:
            names[n] = first_names.setdefault(repr(identity), names[n])
    # By name first: comparing every line with every other is quadratic in a long manifest.
    # Names that differ only in case are one file where the records may go (macOS, Windows):
    # gas/CO.xyz's record held Co.xyz's calculation once both had run.
    by_name: dict[str, list[tuple[BatchItem, tuple]]] = {}
    for item, name, identity in zip(items, names, identities):
        if item.error is None:
            by_name.setdefault(name.casefold(), []).append((item, identity))
    # Its options were not read, so its name says little: it must not number the record of a
    # good line (which a fixed manifest then named otherwise, and computed again).
    # A pattern that matched nothing is such a line: its wildcards would name a file that
    # every shell command on the folder reads as a pattern.
    unread = {item.index: (f"{WILDCARDS.sub('_', name)}-item{item.index}" if item.line is None
                           else f"{WILDCARDS.sub('_', name)}-line{item.line}")
              for item, name in zip(items, names) if item.error is not None}
    clashes = collections.Counter(label.casefold() for label in unread.values())
    chosen = []
    for item, name, identity in zip(items, names, identities):
        if item.error is not None:
            label = unread[item.index]
            chosen.append(f"{label}-{item.index}.h5" if clashes[label.casefold()] > 1
                          else f"{label}.h5")
            continue
        same_name = by_name[name.casefold()]
        if all(other == identity for _, other in same_name):
            chosen.append(f"{name}.h5")
        else:
            first = next(other_item for other_item, other in same_name if other == identity)
            chosen.append(f"{name}-{first.index}.h5")
    return chosen


# The settings that name a basis set, compared by what PySCF loads for them: STO-3G, sto-3g
# and sto3g are one, and so are ano and ano-rcc (one library file).
BASIS_OPTIONS = ("basis", "auxbasis", "jk_auxbasis")
# Options of a line that change how its calculation runs, not what its record holds: a
# complete record made with others is reused (they are not among the inputs a reuse
# compares), so a line that differs from another only in them was numbered as a clash and
# computed twice, and adding one to a line renamed both records.
HOW_IT_RUNS = {"memory": None, "threads": None, "occ_block": None, "scratch": None,
               "resume": False}


def _calculation(item: BatchItem, settings: RunSettings) -> tuple | None:
    """What a batch line computes, to tell two listings of one calculation (None: a line
    that cannot run, never the same as another)."""
    if item.error is not None:
        return None
    split = None if item.interaction is None else sorted(item.interaction.items())
    named = {field: same_basis_name(value) for field in BASIS_OPTIONS
             if (value := getattr(settings, field)) is not None}
    # The settings without the names, which are compared by their keys beside them.
    unnamed = dataclasses.replace(settings, molecule=Path(), **dict.fromkeys(BASIS_OPTIONS, ""),
                                  **HOW_IT_RUNS)
    return settings.molecule.resolve(), named, unnamed, split


def _failed_record(path: Path, settings: RunSettings, error: str) -> None:
    """Say 'failed' in a new record where the run could not write one itself. An existing
    record is left alone: it may be complete, or belong to another run. So is a path whose
    lock another run holds: it may not have written its record yet, and will."""
    root = new_record(SCHEMA, settings.command, preamble.versions())
    set_status(root, FAILED, error)
    CalculationInputs(xyz="", source=str(settings.molecule), basis=settings.basis,
                      auxbasis=settings.auxbasis or "default").write(root)
    try:
        with RecordLock(path):
            # lexists: a dangling link (which the error says to remove) stays as it was.
            if not os.path.lexists(path):
                write_record(path, root)
    except RecordInUse:
        return
    except Dfmp2Error as exc:
        log.error("%s", exc)


def _batch_option(option: str) -> str | None:
    """A batch line's errors in the batch's words: its record's folder is --out (it has no
    -o); every other option keeps its name."""
    return "--out" if option == "output" else None


def _failed_row(row: dict, settings: RunSettings, error: str, start: float) -> dict:
    _failed_record(settings.output, dataclasses.replace(settings, basis=row["basis"]), error)
    return {**row, "status": "failed", "error": error, "seconds": time.perf_counter() - start}


def run_item(item: BatchItem, settings: RunSettings) -> dict:
    row = {"index": item.index, "molecule": str(item.molecule),
           "basis": "" if item.options_unread else settings.basis,
           "record": str(settings.output), "error": ""}
    start = time.perf_counter()
    if item.error is not None:
        return _failed_row(row, settings, item.error, start)
    try:
        with interface_errors(settings.output, False, _batch_option):
            if item.interaction is not None:
                values = _run_dimer(item, settings)
            else:
                outcome = run_job.run(settings, reuse_complete=True)
                # A reused record's --check result stands as it was (a failed check was
                # reported once, then as plain 'complete (skipped)' on every rerun).
                check = CheckSection.read(outcome.record)
                failed = (outcome.exit_code != 0 if not outcome.reused
                          else check is not None and not check.passed)
                state = (CHECK_FAILED if failed else
                         "complete (skipped)" if outcome.reused else "complete")
                values = {"status": state, **_energies(outcome.record, outcome.path)}
    except Interrupted:
        raise
    except RecordInUse as exc:
        # The run holding the record writes it and reports on it; a failure here would
        # contradict the record once that run completes it, if it is this calculation.
        return {**row, "status": RUNNING_ELSEWHERE, "error": str(exc),
                "seconds": time.perf_counter() - start,
                SAME_CALCULATION: getattr(exc, "same_calculation", None)}
    except Dfmp2Error as exc:
        return _failed_row(row, settings, str(exc), start)
    except Exception as exc:  # a bug must not cost the rest of the batch its results
        log.exception("internal error on %s", item.molecule)
        return _failed_row(row, settings, f"internal error: {exc!r}", start)
    return {**row, **values, "seconds": time.perf_counter() - start}


def _energies(root: Node, path: Path) -> dict:
    """The summary's energy columns of a complete record."""
    if schema(root) == INTERACTION_SCHEMA:
        from dfmp2.jobs import interaction as cp
        return cp.batch_values(root)
    summary = json_summary(root, str(path))
    return {key: summary[key] for key in ("e_scf", "e_corr", "e_tot")}


def _run_dimer(item: BatchItem, settings: RunSettings) -> dict:
    from dfmp2.jobs import interaction as cp
    outcome = cp.run_interaction(settings, item.interaction["split"],
                                 cp.parse_pair(item.interaction["charges"], "--charges"),
                                 cp.parse_pair(item.interaction["spins"], "--spins"),
                                 settings.output, reuse_complete=True)
    return {"status": "complete (skipped)" if outcome.reused else "complete",
            **cp.batch_values(outcome.record)}


def run_batch(items: list[BatchItem], base: RunSettings, out_dir: Path,
              shard: tuple[int, int], show_progress: bool | None = None
              ) -> tuple[list[dict], Interrupted | None]:
    """One row per molecule of the shard, and the signal that stopped the batch (None: it ran
    to its end). After a signal the molecule it interrupted is ``interrupted`` (its record
    resumes) and the ones after it ``not started``: none of them has failed. A signal stops a
    calculation at once, but one that comes while the batch finds out whether a molecule needs
    computing, or reports on it, waits for its row: a complete record it was skipping was
    listed ``interrupted``."""
    create_folder(out_dir, "choose another --out")
    if not can_create_files_in(out_dir, ".summary."):
        # Found per molecule, each failed without a record, and the summary then failed the
        # batch without printing its rows.
        raise InputError(f"--out {out_dir} is not a writable folder; choose another --out")
    for path in summary_paths(out_dir, shard):
        # Found only when the summary was written, after every molecule was computed, and
        # the results table was never printed.
        if existing_kind(path) == "a directory":
            raise InputError(f"{path} is a folder, where the batch writes its summary; move "
                             "it, or choose another --out")
    all_settings = [line_settings(base, item) for item in items]
    names = record_names(items, all_settings)
    k, n = shard
    chosen = [(item, dataclasses.replace(s, output=out_dir / name, show_progress=False))
              for item, s, name in zip(items, all_settings, names) if item.index % n == k]
    progress = Progress(len(chosen), f"batch {k}/{n}", show_progress)
    rows: list[dict] = []
    running, start = None, 0.0
    try:
        for item, settings in chosen:
            running, start = item, time.perf_counter()
            with interrupts.signals_held():
                rows.append(run_item(item, settings))
            running = None
            progress.advance()
    except Interrupted as stop:
        rows += [_stopped_row(item, settings, stop, start if item is running else None)
                 for item, settings in chosen[len(rows):]]
        return rows, stop
    return rows, None


def _stopped_row(item: BatchItem, settings: RunSettings, stop: Interrupted,
                 start: float | None) -> dict:
    """The row of a molecule a signal interrupted (``start``: when it started) or left
    unstarted (None)."""
    return {"index": item.index, "molecule": str(item.molecule), "basis": settings.basis,
            "record": str(settings.output), "status": NOT_STARTED if start is None else INTERRUPTED,
            "error": "" if start is None else str(stop),
            "seconds": 0.0 if start is None else time.perf_counter() - start}


def _as_on_disk(row: dict) -> dict:
    """A row left to another run, as its record says now: that run may have ended since.
    A record of another calculation (the same name with other options, from another batch
    on the same --out) is not this molecule's result: the row fails and says so."""
    row = dict(row)
    same = row.pop(SAME_CALCULATION, None)
    path = Path(row["record"])
    try:
        root = read_record(path)
    except InputError:  # not written yet
        return row
    if same is not None and "input" in root.groups and not same(root):
        return {**row, "status": "failed",
                "error": f"{path} holds another run's calculation of other inputs; run this "
                         "one again once that run has finished, or give it another --out"}
    state = status(root)
    if state == RUNNING:
        return row
    if state == COMPLETE:
        return {**row, **_energies(root, path), "status": f"{COMPLETE} {OTHER_RUN}", "error": ""}
    return {**row, "status": f"{state} {OTHER_RUN}", "error": root.attrs.get("error", "")}


def _replace_file(path: Path, text: str) -> None:
    # Two batches on one --out write the same summary: each is written beside it and renamed
    # over it, so the file is always one batch's whole summary, never a mix of both.
    temporary = path.parent / f".{path.name}.{os.getpid()}-{os.urandom(4).hex()}.tmp"
    try:
        fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
        try:
            with os.fdopen(fd, "w", encoding="utf-8", newline="") as handle:
                handle.write(text)
            os.replace(temporary, path)
        except BaseException:
            temporary.unlink(missing_ok=True)
            raise
    except OSError as exc:
        raise RunFailure(f"cannot write the batch summary {path}: "
                         f"{exc.strerror or exc}") from None


def settled(rows: list[dict]) -> list[dict]:
    """Rows left to another run take the status their records have now, so a summary never
    contradicts a record."""
    return [_as_on_disk(row) if row["status"] == RUNNING_ELSEWHERE else row for row in rows]


def summary_paths(out_dir: Path, shard: tuple[int, int]) -> tuple[Path, Path]:
    """The CSV and JSON summaries of a batch's shard."""
    stem = "summary" if shard == (0, 1) else f"summary-shard-{shard[0]}-of-{shard[1]}"
    return out_dir / f"{stem}.csv", out_dir / f"{stem}.json"


def write_summaries(rows: list[dict], out_dir: Path, shard: tuple[int, int]
                    ) -> tuple[list[dict], str | None]:
    """Write the CSV and JSON summaries of :func:`settled` rows; returns the rows and why the
    summaries could not be written (None: they were). Not raised: the rows are the batch's
    results, to be shown whatever happens to their copies (a full disk there ended the batch
    without its table, and ``--json`` printed nothing)."""
    rows = settled(rows)
    csv_path, json_path = summary_paths(out_dir, shard)
    table = io.StringIO(newline="")
    writer = csv.DictWriter(table, fieldnames=SUMMARY_FIELDS)
    writer.writeheader()
    for row in rows:
        writer.writerow({key: _csv_cell(row.get(key, "")) for key in SUMMARY_FIELDS})
    try:
        _replace_file(csv_path, table.getvalue())
        _replace_file(json_path, json.dumps(rows, indent=1, default=str) + "\n")
    except RunFailure as exc:
        return rows, str(exc)
    return rows, None


def _csv_cell(value):
    """A summary value for the CSV. Text is shown as on the terminal (bytes that are not UTF-8
    and control characters as escapes; the JSON keeps the exact text, and os.fsencode of its
    \\udcNN escapes gives a name's bytes back), and text that a spreadsheet would take for a
    formula (a file named ``=cmd|...``) starts with a quote, as OWASP advises for CSV files."""
    if not isinstance(value, str):
        return value
    text = printable(value, one_line=True)
    return f"'{text}" if text.startswith(FORMULA_STARTS) else text


def format_table(rows: list[dict]) -> str:
    lines = [f"{'#':>3} {'molecule':<32} {'basis':<10} {'status':<24} {'E_corr / Eh':>16} "
             f"{'E_tot / Eh':>18} {'s':>7}"]
    for row in rows:
        e_corr = f"{row['e_corr']:16.10f}" if "e_corr" in row else f"{'-':>16}"
        e_tot = f"{row['e_tot']:18.10f}" if "e_tot" in row else f"{'-':>18}"
        name, basis, status = (printable(text, one_line=True) for text in
                               (Path(row["molecule"]).name, row["basis"] or "-",
                                row["status"]))
        lines.append(f"{row['index']:>3} {name[:32]:<32} "
                     f"{basis[:10]:<10} {status[:24]:<24} {e_corr} {e_tot} "
                     f"{row['seconds']:7.1f}")
    left = [printable(Path(row["molecule"]).name, one_line=True) for row in rows
            if row["status"] == RUNNING_ELSEWHERE or row["status"].endswith(OTHER_RUN)]
    if left:
        lines += ["", f"left to another dfmp2 run that held their records: {', '.join(left)}"]
    return "\n".join(lines)
