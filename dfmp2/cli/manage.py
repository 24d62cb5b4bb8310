"""The commands over many molecules or finished records: batch, bench, compare and show."""
from __future__ import annotations

import json
import logging
import math
import os
from pathlib import Path

import click

from dfmp2.cli import views
from dfmp2.cli.calculate import interaction_command, refuse_ranks, run_command
from dfmp2.cli.group import cli
from dfmp2.cli.options import (AsciiInt, CALCULATION_OPTIONS, MOLECULE_OPTIONS, VERBOSE, XC_OPTIONS,
                               XYZ_FILE, environment_settings, output_option,
                               with_options)
from dfmp2.errors import RunFailure
from dfmp2.input.settings import RunSettings
from dfmp2.jobs import batch, bench, compare, manifest
from dfmp2.jobs.bench import MAX_REPEATS
from dfmp2.records.tree import interpreting, read_record
from dfmp2.system import distributed
from dfmp2.system.memory import memory_budget

log = logging.getLogger(__name__)


@cli.command("batch")
@click.argument("inputs", nargs=-1, required=True)
@with_options(*CALCULATION_OPTIONS, *XC_OPTIONS)
@click.option("--out", "out_dir", type=click.Path(file_okay=False, path_type=Path),
              default=Path("runs/batch"), show_default=True, help="Folder for the records.")
@click.option("--shard", default=None,
              help="Run every N-th molecule from K (K/N); 'array' or by default: this "
                   "task's position in a Slurm array (SLURM_ARRAY_TASK_ID, _MIN, _MAX, _STEP, "
                   "_COUNT).")
@click.option("--check", is_flag=True, help="Compare each molecule with PySCF's DFMP2.")
@click.option("--interaction", "dimers", is_flag=True,
              help="Treat every XYZ input as a dimer (split from its comment line).")
@click.option("--json", "as_json", is_flag=True, help="Print the summary rows as JSON.")
@click.pass_obj
def batch_command(obj: dict, inputs: tuple[str, ...], out_dir: Path, shard: str | None,
                  dimers: bool, as_json: bool, **options) -> int:
    """Run many molecules (XYZ files, globs or manifests), one record each in --out.

    A manifest has one molecule per line, `path.xyz [dfmp2 run options]`; '#' starts a comment.
    A line with `--split N` (and `--charges a,b`, `--spins a,b`) is a dimer for a counterpoise
    interaction-energy job. A line that cannot run is recorded as failed and the rest run.
    Complete records of the same inputs are skipped, so a rerun finishes an interrupted batch.
    A molecule whose record another dfmp2 run is writing is left to that run, not failed.
    """
    # Manifest lines are parsed with the options of the commands they stand for.
    commands = {"run": run_command, "interaction": interaction_command}
    items = manifest.collect_items(list(inputs), commands, dimers)
    launch = distributed.launch_from(os.environ)
    # Joining checks that the other ranks exist: rank variables left over in a shell would
    # otherwise make a batch that runs only its share and looks complete.
    world = distributed.init_world(launch)
    shard_k_n = batch.parse_shard(shard, os.environ, world.rank, world.size)
    if world.size > 1 and options.get("memory") is None:
        # The default budget is the node's: its ranks, each running its own molecules,
        # share it (each took all of it, so two ranks on a node planned 120% of its memory).
        options["memory"] = memory_budget(None) // world.ranks_on_this_node()
    base = RunSettings(molecule=Path(), command=obj["command"], **options,
                       **environment_settings())
    try:
        rows, stop = batch.run_batch(items, base, out_dir, shard_k_n)
    except BaseException:
        world.close(failed=True)
        raise
    if stop is not None:
        world.close(failed=True)
        rows, unwritten = batch.write_summaries(rows, out_dir, shard_k_n)
        views.print_batch(rows, [] if unwritten else batch.summary_paths(out_dir, shard_k_n),
                          as_json)
        if unwritten:
            log.error("%s", unwritten)
        raise stop
    # Under a launcher the ranks meet when every share is done: a rank that ended early with
    # a failure made torchrun stop the others, whose molecules then never finished. Then a
    # row left to a sibling rank (a duplicate) reads that rank's finished record, and rank 0
    # alone prints the whole batch (each rank printed its own table or JSON array).
    # Written before the meeting too: a rank stopped while it waits keeps its share's rows.
    rows, _ = batch.write_summaries(rows, out_dir, shard_k_n)
    try:
        shares = world.gather_when_all_arrive((rows, shard_k_n),
                                              "waiting for every rank's share of the batch")
    except BaseException:
        world.close(failed=True)
        raise
    world.close()
    _, unwritten = batch.write_summaries(rows, out_dir, shard_k_n)
    rows = sorted(batch.settled([row for share, _ in shares for row in share]),
                  key=lambda row: row["index"])
    if not world.is_root:
        if unwritten:
            raise RunFailure(unwritten)
        return 1 if any(row["status"] in ("failed", batch.CHECK_FAILED) for row in rows) else 0
    views.print_batch(rows, [path for _, shard in shares if not (unwritten and shard == shard_k_n)
                             for path in batch.summary_paths(out_dir, shard)], as_json)
    # After the rows: they are the results, whatever happened to their copies.
    summary_note = f"; {unwritten}" if unwritten else ""
    failed = [row for row in rows if row["status"] == "failed"]
    if failed:
        names = "; ".join(f"{Path(r['molecule']).name} ({r['error']})" for r in failed)
        raise RunFailure(f"{len(failed)} of {len(rows)} molecules failed: {names}{summary_note}")
    # As `dfmp2 run --check` does, a disagreement with PySCF ends the batch with status 1.
    disagreeing = [row for row in rows if row["status"] == batch.CHECK_FAILED]
    if disagreeing:
        names = ", ".join(Path(r["molecule"]).name for r in disagreeing)
        raise RunFailure(f"{len(disagreeing)} of {len(rows)} molecules disagree with PySCF "
                         f"beyond the --check tolerance: {names}{summary_note}")
    if unwritten:
        raise RunFailure(unwritten)
    return 0


@cli.command("bench")
@click.argument("molecule", type=XYZ_FILE)
@with_options(*CALCULATION_OPTIONS, *MOLECULE_OPTIONS)
@click.option("--repeat", type=AsciiInt(min=1, max=MAX_REPEATS), default=1,
              show_default=True,
              help="Timed repeats; medians are reported (the machine may be shared).")
@click.option("--skip-pyscf", is_flag=True, help="Time dfmp2 only.")
@output_option("Benchmark record (default: runs/bench-<molecule>-<basis>-<precision>.h5).")
@click.option("--json", "as_json", is_flag=True)
@click.pass_obj
def bench_command(obj: dict, molecule: Path, repeat: int, skip_pyscf: bool, as_json: bool,
                  **options) -> int:
    """Time the whole calculation, its SCF and its MP2 stage against PySCF's."""
    refuse_ranks("bench")
    settings = RunSettings(molecule=molecule, command=obj["command"], **options,
                           **environment_settings())
    summary, text = bench.run_bench(settings, repeat, skip_pyscf)
    # JSON has no NaN: a figure this bench did not measure is null.
    views.emit(json.dumps({key: None if isinstance(value, float) and not math.isfinite(value)
                           else value for key, value in summary.items()}, allow_nan=False)
               if as_json else text)
    # The measurements are shown first: they took the repeats' time.
    if summary.get("record_error"):
        raise RunFailure(summary["record_error"])
    return 0


@cli.command("compare")
@click.argument("records", nargs=-1, required=True,
                type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--reference", type=click.Choice(["first", "pyscf"]), default="first",
              show_default=True,
              help="Compare with the first record, or with PySCF recomputed from each record's "
                   "settings.")
@click.option("--json", "as_json", is_flag=True)
@VERBOSE
def compare_command(records: tuple[Path, ...], reference: str, as_json: bool) -> int:
    """Energies of run records side by side, with differences."""
    views.print_comparison(compare.compare(list(records), reference), as_json)
    return 0


@cli.command("show")
@click.argument("record", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--all", "show_all", is_flag=True, help="Every attribute and dataset.")
@VERBOSE
def show_command(record: Path, show_all: bool) -> int:
    """Print a run record readably."""
    root = read_record(record)
    with interpreting(record):
        views.print_record(root, show_all)
    return 0
