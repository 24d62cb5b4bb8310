"""`dfmp2 batch`: many molecules, one record each, resumable and shardable.

Manifest format: one molecule per line, ``path/to/molecule.xyz [run options]``, with the same
options as ``dfmp2 run`` (e.g. ``water.xyz --basis cc-pvtz --frozen-core``). A line with
``--split N`` (and optionally ``--charges a,b`` / ``--spins a,b``) is a dimer: it gets a
counterpoise interaction-energy job with the options of ``dfmp2 interaction``. Paths are
relative to the manifest's folder; blank lines and lines starting with ``#`` are ignored.
Options on a line override the batch's own options for that molecule.

A line that cannot run (a missing file, an unknown option) is recorded as failed and the
batch goes on. A record that is already complete counts as done only when it was computed
with the same inputs; otherwise the molecule is recomputed and the old record is kept beside
the new one (see :mod:`dfmp2.checkpoint`).
"""
from __future__ import annotations

import csv
import dataclasses
import glob
import json
import logging
import shlex
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import click

from dfmp2 import pipeline
from dfmp2.errors import Dfmp2Error, InputError
from dfmp2.progress import Progress
from dfmp2.record import FAILED, SCHEMA, CalculationInputs, new_record, set_status, write_record
from dfmp2.report import json_summary
from dfmp2.settings import RunSettings

log = logging.getLogger(__name__)
GLOB_CHARACTERS = set("*?[")
SUMMARY_FIELDS = ("index", "molecule", "basis", "status", "e_scf", "e_corr", "e_tot",
                  "e_int_mp2_cp", "e_int_dh_cp", "seconds", "record", "error")
INTERACTION_OPTIONS = ("--split", "--charges", "--spins")


@dataclass
class BatchItem:
    index: int
    molecule: Path
    overrides: dict
    interaction: dict | None = None
    error: str | None = None


def _manifest_items(manifest: Path, commands: dict[str, click.Command],
                    start: int) -> list[BatchItem]:
    try:
        lines = manifest.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError):
        return [BatchItem(start, manifest, {}, error=f"manifest {manifest} cannot be read as "
                                                      "text")]
    items = []
    for number, line in enumerate(lines, start=1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        items.append(_line_item(manifest, number, line, commands, start + len(items)))
    return items


def _line_item(manifest: Path, number: int, line: str, commands: dict[str, click.Command],
               index: int) -> BatchItem:
    where = f"{manifest}, line {number}"
    try:
        tokens = shlex.split(line)
    except ValueError as exc:
        return BatchItem(index, manifest, {}, error=f"{where}: {exc}")
    path = Path(tokens[0])
    path = path if path.is_absolute() else manifest.parent / path
    is_dimer = any(token.split("=")[0] in INTERACTION_OPTIONS for token in tokens[1:])
    name = "interaction" if is_dimer else "run"
    try:
        ctx = commands[name].make_context(name, [str(path), *tokens[1:]], obj={"command": ""})
    except click.ClickException as exc:
        return BatchItem(index, path, {}, error=f"{where}: {exc.format_message()}")
    overrides = {key: value for key, value in ctx.params.items()
                 if ctx.get_parameter_source(key) == click.core.ParameterSource.COMMANDLINE
                 and key not in ("molecule", "dimer")}
    if overrides.pop("as_json", None) or overrides.pop("output", None):
        return BatchItem(index, path, {}, error=f"{where}: --json and -o are chosen by the "
                                                "batch, not per molecule")
    interaction = None
    if is_dimer:
        interaction = {key: overrides.pop(key, None) for key in ("split", "charges", "spins")}
    return BatchItem(index, path, overrides, interaction)


def collect_items(inputs: list[str], commands: dict[str, click.Command],
                  dimers: bool = False) -> list[BatchItem]:
    """XYZ files, globs of them, and manifests, in the order given. With ``dimers`` every XYZ
    input is a dimer whose split is read from its comment line. Inputs that do not exist
    become failed items."""
    as_dimer = {"split": None, "charges": None, "spins": None} if dimers else None
    items: list[BatchItem] = []
    for text in inputs:
        if GLOB_CHARACTERS & set(text):
            matches = sorted(glob.glob(text))
            if not matches:
                items.append(BatchItem(len(items), Path(text), {},
                                       error=f"the pattern {text!r} matches no file"))
            items += [BatchItem(len(items) + n, Path(m), {}, as_dimer)
                      for n, m in enumerate(matches)]
            continue
        path = Path(text)
        if not path.is_file():
            items.append(BatchItem(len(items), path, {}, error=f"{text}: no such file"))
        elif path.suffix.lower() == ".xyz":
            items.append(BatchItem(len(items), path, {}, as_dimer))
        else:
            items += _manifest_items(path, commands, len(items))
    if not items:
        raise InputError("no molecules to run")
    return items


def parse_shard(text: str | None, environ: Mapping[str, str], rank: int = 0,
                world_size: int = 1) -> tuple[int, int]:
    """``K/N`` (0 <= K < N); by default this process's rank under torchrun/srun (molecules are
    spread over ranks), else the task of a Slurm array job (from ``environ``), else 0/1."""
    if text is None and world_size > 1:
        return rank, world_size
    if text is None:
        task = environ.get("SLURM_ARRAY_TASK_ID")
        count = environ.get("SLURM_ARRAY_TASK_COUNT")
        if task is None or count is None:
            return 0, 1
        first = int(environ.get("SLURM_ARRAY_TASK_MIN", "0"))
        return int(task) - first, int(count)
    try:
        k, n = (int(part) for part in text.split("/"))
    except ValueError:
        raise InputError(f"--shard {text!r}: write it as K/N, e.g. 0/4") from None
    if not 0 <= k < n:
        raise InputError(f"--shard {text}: K must satisfy 0 <= K < N")
    return k, n


def record_names(items: list[BatchItem], settings: list[RunSettings]) -> list[str]:
    """``<molecule>-<basis>[-<functional>].h5``, numbered where two molecules would share a
    name."""
    names = [f"{s.molecule.stem}-{s.basis.lower()}{s.xc_suffix()}"
             + ("-interaction" if item.interaction is not None else "")
             for s, item in zip(settings, items)]
    return [f"{name}.h5" if names.count(name) == 1 else f"{name}-{item.index}.h5"
            for name, item in zip(names, items)]


def _failed_record(path: Path, settings: RunSettings, error: str) -> None:
    """Say 'failed' in a new record where the run could not write one itself. An existing
    record is left alone: it may be complete, or belong to another run."""
    if path.exists():
        return
    root = new_record(SCHEMA, settings.command, pipeline.versions())
    set_status(root, FAILED, error)
    CalculationInputs(xyz="", source=str(settings.molecule), basis=settings.basis,
                      auxbasis=settings.auxbasis or "default").write(root)
    try:
        write_record(path, root)
    except Dfmp2Error as exc:
        log.error("%s", exc)


def _failed_row(row: dict, settings: RunSettings, error: str, start: float) -> dict:
    _failed_record(settings.output, settings, error)
    return {**row, "status": "failed", "error": error, "seconds": time.perf_counter() - start}


def run_item(item: BatchItem, settings: RunSettings) -> dict:
    row = {"index": item.index, "molecule": str(item.molecule), "basis": settings.basis,
           "record": str(settings.output), "error": ""}
    start = time.perf_counter()
    if item.error is not None:
        return _failed_row(row, settings, item.error, start)
    try:
        if item.interaction is not None:
            values = _run_dimer(item, settings)
        else:
            outcome = pipeline.run(settings, reuse_complete=True)
            summary = json_summary(outcome.record, str(outcome.path))
            status = ("complete (skipped)" if outcome.reused else
                      "complete" if outcome.exit_code == 0 else "complete (check failed)")
            values = {"status": status, "e_scf": summary["e_scf"],
                      "e_corr": summary["e_corr"], "e_tot": summary["e_tot"]}
    except Dfmp2Error as exc:
        return _failed_row(row, settings, str(exc), start)
    except Exception as exc:  # a bug must not cost the rest of the batch its results
        log.exception("internal error on %s", item.molecule)
        return _failed_row(row, settings, f"internal error: {exc!r}", start)
    return {**row, **values, "seconds": time.perf_counter() - start}


def _run_dimer(item: BatchItem, settings: RunSettings) -> dict:
    from dfmp2 import interaction as cp
    outcome = cp.run_interaction(settings, item.interaction["split"],
                                 cp.parse_pair(item.interaction["charges"], "--charges"),
                                 cp.parse_pair(item.interaction["spins"], "--spins"),
                                 settings.output, reuse_complete=True)
    return {"status": "complete (skipped)" if outcome.reused else "complete",
            **cp.batch_values(outcome.record)}


def run_batch(items: list[BatchItem], base: RunSettings, out_dir: Path,
              shard: tuple[int, int], show_progress: bool | None = None) -> list[dict]:
    out_dir.mkdir(parents=True, exist_ok=True)
    all_settings = [dataclasses.replace(base, molecule=item.molecule, **item.overrides)
                    for item in items]
    names = record_names(items, all_settings)
    k, n = shard
    chosen = [(item, dataclasses.replace(s, output=out_dir / name, show_progress=False))
              for item, s, name in zip(items, all_settings, names) if item.index % n == k]
    progress = Progress(len(chosen), f"batch {k}/{n}", show_progress)
    rows = []
    for item, settings in chosen:
        rows.append(run_item(item, settings))
        progress.advance()
    return rows


def write_summaries(rows: list[dict], out_dir: Path, shard: tuple[int, int]) -> tuple[Path, Path]:
    stem = "summary" if shard == (0, 1) else f"summary-shard-{shard[0]}-of-{shard[1]}"
    csv_path, json_path = out_dir / f"{stem}.csv", out_dir / f"{stem}.json"
    with open(csv_path, "w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, fieldnames=SUMMARY_FIELDS)
        writer.writeheader()
        for row in rows:
            writer.writerow({key: row.get(key, "") for key in SUMMARY_FIELDS})
    json_path.write_text(json.dumps(rows, indent=1, default=str) + "\n", encoding="utf-8")
    return csv_path, json_path


def format_table(rows: list[dict]) -> str:
    lines = [f"{'#':>3} {'molecule':<32} {'basis':<10} {'status':<24} {'E_corr / Eh':>16} "
             f"{'E_tot / Eh':>18} {'s':>7}"]
    for row in rows:
        e_corr = f"{row['e_corr']:16.10f}" if "e_corr" in row else f"{'-':>16}"
        e_tot = f"{row['e_tot']:18.10f}" if "e_tot" in row else f"{'-':>18}"
        lines.append(f"{row['index']:>3} {Path(row['molecule']).name[:32]:<32} "
                     f"{row['basis'][:10]:<10} {row['status'][:24]:<24} {e_corr} {e_tot} "
                     f"{row['seconds']:7.1f}")
    return "\n".join(lines)
