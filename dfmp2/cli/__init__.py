"""The `dfmp2` command line (click). Results go to stdout, progress and errors to stderr.

This is the edge of the program: it alone reads environment variables (DFMP2_REQUIRE_NKI,
DFMP2_NKI_MODE, DFMP2_DIST_TIMEOUT, the launcher's rank variables and Slurm's array variables)
and handles signals, and hands everything to the library as arguments.
"""
from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import shlex
import signal
import sys
import threading
from dataclasses import replace
from pathlib import Path

import click

import kernels
from dfmp2 import __version__
from dfmp2.system import distributed
from dfmp2.jobs import pipeline
from dfmp2.records import report
from dfmp2.mp2.methods import METHODS
from dfmp2.errors import Dfmp2Error, Interrupted, RunFailure
from dfmp2.system.memory import parse_size
from dfmp2.records.tree import SCHEMA, read_record, schema
from dfmp2.system.files import printable
from dfmp2.mp2.methods import SCS_OS_DEFAULT, SCS_SS_DEFAULT
from dfmp2.input.calculation import REFERENCES
from dfmp2.scf.reference import SCF_METHODS
from dfmp2.input.functionals import GRID_LEVELS, known_names
from dfmp2.scf.engine import ENGINES
from dfmp2.input.settings import RunSettings


XYZ_FILE = click.Path(exists=True, dir_okay=False, path_type=Path)
REQUIRE_NKI_ENV = "DFMP2_REQUIRE_NKI"
NKI_MODE_ENV = "DFMP2_NKI_MODE"
# The real NKI simulator targets trn3 unless told otherwise; our kernels are written for trn1.
NKI_PLATFORM_ENV = "NEURON_PLATFORM_TARGET_OVERRIDE"
EXIT_SIGINT = 128 + signal.SIGINT
# Published SCS and double-hybrid scales lie between 0 and 2; this bound only stops factors
# whose products with an energy would be meaningless or overflow.
MAX_SCALE_FACTOR = 100.0


class MemorySize(click.ParamType):
    name = "size"

    def convert(self, value, param, ctx):
        if isinstance(value, int):
            return value
        try:
            return parse_size(value)
        except Dfmp2Error as exc:
            self.fail(str(exc), param, ctx)


class ScaleFactor(click.ParamType):
    """An energy scale factor: a finite number of ordinary size. NaN, infinities and huge
    factors would end up as non-finite or absurd energies, which ``--json`` cannot hold."""

    name = "number"

    def convert(self, value, param, ctx):
        try:
            number = float(value)
        except (TypeError, ValueError):
            self.fail(f"{value!r} is not a number", param, ctx)
        if not math.isfinite(number):
            self.fail(f"{value!r} is not a finite number", param, ctx)
        if abs(number) > MAX_SCALE_FACTOR:
            self.fail(f"{value!r} is not a scale factor: give a number between "
                      f"-{MAX_SCALE_FACTOR:g} and {MAX_SCALE_FACTOR:g}", param, ctx)
        return number


def set_verbosity(ctx: click.Context, param: click.Parameter, count: int) -> None:
    if count:
        level = logging.INFO if count == 1 else logging.DEBUG
        logging.getLogger().setLevel(min(logging.getLogger().level, level))


VERBOSE = click.option("-v", "--verbose", count=True, expose_value=False, callback=set_verbosity,
                       help="More log output on stderr (-vv for debug).")

CALCULATION_OPTIONS = (
    click.option("--basis", default="cc-pvdz", show_default=True,
                 help="Orbital basis (PySCF name)."),
    click.option("--auxbasis", default=None,
                 help="Auxiliary (RI) basis for MP2; default: the MP2-fit partner of --basis."),
    click.option("--ecp", default=None,
                 help="Effective core potentials: a PySCF name, or 'none' for all-electron "
                      "(default: those of --basis, e.g. def2-* from Rb on)."),
    click.option("--frozen-core", is_flag=True, help="Freeze PySCF's standard core orbitals."),
    click.option("--backend", type=click.Choice(kernels.BACKENDS), default="auto",
                 show_default=True, help="Kernel backend: nki on Trainium, torch elsewhere."),
    click.option("--precision", type=click.Choice(kernels.PRECISIONS), default=None,
                 help="Contraction precision (default fp64 on torch; NKI is fp32)."),
    click.option("--fused-energy", is_flag=True,
                 help="Form (ia|jb) tiles and reduce them in one kernel, never storing the "
                      "block."),
    click.option("--memory", type=MemorySize(), default=None,
                 help="Memory budget, e.g. 4GB (default: 60% of available RAM)."),
    click.option("--scf", "scf_method", type=click.Choice(SCF_METHODS), default="df",
                 show_default=True, help="Density-fitted (JK-fit) or conventional SCF."),
    click.option("--scf-engine", type=click.Choice(ENGINES), default="kernels",
                 show_default=True,
                 help="Who builds the density-fitted SCF's J and K: our kernels or PySCF."),
    click.option("--threads", type=click.IntRange(min=1), default=None,
                 help="Threads for torch and PySCF (default: all available cores)."),
    click.option("--scs-os", type=ScaleFactor(), default=SCS_OS_DEFAULT, show_default=True,
                 help="SCS-MP2 opposite-spin scale."),
    click.option("--scs-ss", type=ScaleFactor(), default=SCS_SS_DEFAULT, show_default=True,
                 help="SCS-MP2 same-spin scale."),
    click.option("--stability", is_flag=True,
                 help="Check a closed-shell SCF's internal stability too (open shells always "
                      "are); an unstable reference is reported with a warning."),
    VERBOSE,
)

XC_OPTIONS = (
    click.option("--xc", default=None,
                 help=f"Double hybrid on a Kohn-Sham reference: {known_names()}, or a PySCF "
                      "exchange-correlation string with --mp2-os and --mp2-ss."),
    click.option("--mp2-os", type=ScaleFactor(), default=None,
                 help="Opposite-spin MP2 scale of a custom --xc."),
    click.option("--mp2-ss", type=ScaleFactor(), default=None,
                 help="Same-spin MP2 scale of a custom --xc."),
    click.option("--grid", type=click.IntRange(GRID_LEVELS.start, GRID_LEVELS.stop - 1),
                 default=None, help="PySCF integration grid level for --xc (default: PySCF's, 3)."),
)

MOLECULE_OPTIONS = (
    click.option("--charge", type=int, default=None,
                 help="Total charge (default: 'charge=N' in the XYZ comment, else 0)."),
    click.option("--spin", type=int, default=None,
                 help="2S = N_alpha - N_beta (default: from 'multiplicity=M' in the comment, "
                      "else 0)."),
    click.option("--frozen", type=click.IntRange(min=0), default=None,
                 help="Freeze this many lowest occupied orbitals."),
    click.option("--reference", type=click.Choice(REFERENCES), default="auto",
                 show_default=True,
                 help="SCF reference: RHF for closed shells and UHF for spin > 0 unless given."),
    click.option("--occ-block", type=click.IntRange(min=1), default=None,
                 help="Occupied orbitals per energy block (default: from --memory)."),
    click.option("--scratch", type=click.Path(file_okay=False, path_type=Path), default=None,
                 help="Folder for the out-of-core B file (default: beside the record)."),
)


def with_options(*options):
    def decorate(command):
        for option in reversed(options):
            command = option(command)
        return command
    return decorate


def environment_settings() -> dict:
    """The RunSettings fields that come from environment variables."""
    mode = os.environ.get(NKI_MODE_ENV, "").strip().lower() or None
    return {"nki_mode": mode, "require_nki": os.environ.get(REQUIRE_NKI_ENV, "") == "1"}


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(version=__version__, prog_name="dfmp2")
@VERBOSE
def cli() -> None:
    """Density-fitted MP2 (RI-MP2) on PySCF orbitals, with NKI and torch kernels."""


@cli.command()
@click.argument("molecule", type=XYZ_FILE)
@with_options(*CALCULATION_OPTIONS, *XC_OPTIONS, *MOLECULE_OPTIONS)
@click.option("--allow-unconverged", is_flag=True, help="Accept an unconverged SCF.")
@click.option("--check", is_flag=True,
              help="Also run PySCF's DFMP2 on the same orbitals; exit 1 if they disagree.")
@click.option("-o", "--output", type=click.Path(path_type=Path), default=None,
              help="Run record path (default: runs/<molecule>-<basis>.h5).")
@click.option("--resume", is_flag=True,
              help="Continue the interrupted run in -o (also done whenever -o holds one).")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of text.")
@click.option("--qcschema", "as_qcschema", is_flag=True,
              help="Print the QCSchema AtomicResult as JSON (needs dfmp2[qcschema]).")
@click.option("--qcschema-version", type=click.Choice(["1", "2"]), default=None,
              help="QCSchema version printed by --qcschema (default 1: what "
                   "qcelemental.models.AtomicResult reads and QCEngine returns for a dict "
                   "input).")
@click.pass_obj
def run(obj: dict, molecule: Path, as_json: bool, as_qcschema: bool,
        qcschema_version: str | None, **options) -> int:
    """Compute the DF-MP2 (or double-hybrid) energy of MOLECULE (an XYZ file) and write a run
    record."""
    settings = RunSettings(molecule=molecule, command=obj["command"], **options,
                           **environment_settings())
    if as_json and as_qcschema:
        raise click.UsageError("give --json or --qcschema, not both")
    if qcschema_version is not None and not as_qcschema:
        raise click.UsageError("--qcschema-version goes with --qcschema")
    qcschema = _qcschema_module() if as_qcschema else None
    world = distributed.init_world(distributed.launch_from(os.environ))
    try:
        if not world.is_root:
            logging.getLogger().setLevel(logging.ERROR)
            settings = replace(settings, show_progress=False)
        outcome = pipeline.run(settings, world)
    finally:
        world.close()
    if not world.is_root:
        return 0
    if qcschema is not None:
        result = qcschema.atomic_result(qcschema.run_input(settings, outcome.record),
                                        outcome.record, outcome.path)
        click.echo(qcschema.serialized(result, int(qcschema_version or
                                                   qcschema.DEFAULT_PRINTED_VERSION)))
    else:
        _print_outcome(outcome, as_json)
    return outcome.exit_code


def _print_outcome(outcome: pipeline.RunOutcome, as_json: bool) -> None:
    """A finished run's summary on stdout: one JSON object, or the text report."""
    if as_json:
        click.echo(json.dumps(report.json_summary(outcome.record, str(outcome.path))))
    else:
        click.echo(report.summary(outcome.record))
        click.echo(f"\nrecord written to {outcome.path}")


def _qcschema_module():
    """:mod:`dfmp2.interfaces.qcschema`, or a usage error saying how to install what it needs."""
    try:
        from dfmp2.interfaces import qcschema
    except ImportError as exc:
        raise click.UsageError(f"--qcschema needs qcelemental ({exc.msg}); install it with "
                               "pip install 'dfmp2[qcschema]'") from None
    return qcschema


METHOD = click.option("--method", type=click.Choice(METHODS), default="mp2", show_default=True,
                      help="Whose gradient: MP2, SCS-MP2 (with --scs-os/--scs-ss) or SOS-MP2.")


@cli.command()
@click.argument("molecule", type=XYZ_FILE)
@with_options(*CALCULATION_OPTIONS, *MOLECULE_OPTIONS)
@METHOD
@click.option("-o", "--output", type=click.Path(path_type=Path), default=None,
              help="Record path (default: runs/<molecule>-<basis>-gradient.h5).")
@click.option("--resume", is_flag=True,
              help="Continue the interrupted run in -o (also done whenever -o holds one).")
@click.option("--json", "as_json", is_flag=True,
              help="Print one JSON object: e_tot (the method's energy) and gradient.")
@click.pass_obj
def gradient(obj: dict, molecule: Path, as_json: bool, **options) -> int:
    """The relaxed analytic DF-MP2 (SCS, SOS) gradient of MOLECULE, in Eh/Bohr."""
    settings = RunSettings(molecule=molecule, command=obj["command"], task="gradient",
                           **options, **environment_settings())
    if settings.output is None:
        settings = replace(settings, output=settings.output_path("-gradient"))
    outcome = pipeline.run(settings)
    _print_outcome(outcome, as_json)
    return outcome.exit_code


@cli.command()
@click.argument("molecule", type=XYZ_FILE)
@with_options(*CALCULATION_OPTIONS, *MOLECULE_OPTIONS)
@METHOD
@click.option("--convergence", default="GAU", show_default=True,
              type=click.Choice(["GAU", "GAU_TIGHT", "GAU_VERYTIGHT", "GAU_LOOSE",
                                 "NWCHEM_LOOSE", "TURBOMOLE", "INTERFRAG_TIGHT"],
                                case_sensitive=False),
              help="geomeTRIC's convergence criteria.")
@click.option("--max-steps", type=click.IntRange(min=1), default=100, show_default=True)
@click.option("-o", "--output", type=click.Path(path_type=Path), default=None,
              help="Record (default: runs/<molecule>-<basis>-opt.h5); the final geometry goes "
                   "beside it as .xyz.")
@click.option("--resume", is_flag=True,
              help="Continue the interrupted optimisation in -o (also done whenever -o holds "
                   "one).")
@click.option("--json", "as_json", is_flag=True,
              help="Print one JSON object: the final energy and geometry.")
@click.pass_obj
def optimize(obj: dict, molecule: Path, convergence: str, max_steps: int, as_json: bool,
             **options) -> int:
    """Optimise the geometry of MOLECULE with geomeTRIC on the DF-MP2 (SCS, SOS) gradient."""
    from dfmp2.jobs import optimize as optimisation
    settings = RunSettings(molecule=molecule, command=obj["command"], **options,
                           **environment_settings())
    outcome = optimisation.run(settings, convergence, max_steps)
    click.echo(json.dumps(optimisation.json_summary(outcome)) if as_json
               else optimisation.format_summary(outcome))
    return 0


@cli.command()
@click.argument("record", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--all", "show_all", is_flag=True, help="Every attribute and dataset.")
@VERBOSE
def show(record: Path, show_all: bool) -> int:
    """Print a run record readably."""
    root = read_record(record)
    detailed = show_all or schema(root) != SCHEMA
    click.echo(printable(report.dump(root) if detailed else report.summary(root)))
    return 0


@cli.command()
@click.argument("dimer", type=XYZ_FILE)
@with_options(*CALCULATION_OPTIONS, *XC_OPTIONS)
@click.option("--split", type=click.IntRange(min=1), default=None,
              help="Monomer A is the first N atoms (default: 'monomer A = first N atoms' in the "
                   "comment line).")
@click.option("--charges", default=None, help="Monomer charges a,b (default 0,0).")
@click.option("--spins", default=None, help="Monomer spins (2S) a,b (default 0,0).")
@click.option("-o", "--output", type=click.Path(path_type=Path), default=None,
              help="Record (default: runs/<dimer>-<basis>-interaction.h5).")
@click.option("--json", "as_json", is_flag=True)
@click.pass_obj
def interaction(obj: dict, dimer: Path, split: int | None, charges: str | None,
                spins: str | None, output: Path | None, as_json: bool, **options) -> int:
    """Counterpoise-corrected (and uncorrected) SCF, MP2 and SCS-MP2 interaction energies."""
    from dfmp2.jobs import interaction as cp
    settings = RunSettings(molecule=dimer, command=obj["command"], **options,
                           **environment_settings())
    outcome = cp.run_interaction(settings, split, cp.parse_pair(charges, "--charges"),
                                 cp.parse_pair(spins, "--spins"), output)
    click.echo(json.dumps(cp.json_summary(outcome.record, outcome.path)) if as_json
               else cp.format_table(outcome.record, outcome.path))
    return 0


@cli.command()
@click.argument("inputs", nargs=-1, required=True)
@with_options(*CALCULATION_OPTIONS, *XC_OPTIONS)
@click.option("--out", "out_dir", type=click.Path(file_okay=False, path_type=Path),
              default=Path("runs/batch"), show_default=True, help="Folder for the records.")
@click.option("--shard", default=None,
              help="Run every N-th molecule from K (K/N); default: this task's position in a "
                   "Slurm array (SLURM_ARRAY_TASK_ID, _MIN, _STEP, _COUNT).")
@click.option("--check", is_flag=True, help="Compare each molecule with PySCF's DFMP2.")
@click.option("--interaction", "dimers", is_flag=True,
              help="Treat every XYZ input as a dimer (split from its comment line).")
@click.option("--json", "as_json", is_flag=True, help="Print the summary rows as JSON.")
@click.pass_obj
def batch(obj: dict, inputs: tuple[str, ...], out_dir: Path, shard: str | None, dimers: bool,
          as_json: bool, **options) -> int:
    """Run many molecules (XYZ files, globs or manifests), one record each in --out.

    A manifest has one molecule per line, `path.xyz [dfmp2 run options]`; '#' starts a comment.
    A line with `--split N` (and `--charges a,b`, `--spins a,b`) is a dimer for a counterpoise
    interaction-energy job. A line that cannot run is recorded as failed and the rest run.
    Complete records of the same inputs are skipped, so a rerun finishes an interrupted batch.
    A molecule whose record another dfmp2 run is writing is left to that run, not failed.
    """
    from dfmp2.jobs import batch as batch_job
    items = batch_job.collect_items(list(inputs), {"run": run, "interaction": interaction},
                                    dimers)
    launch = distributed.launch_from(os.environ)
    shard_k_n = batch_job.parse_shard(shard, os.environ, launch.rank, launch.size)
    base = RunSettings(molecule=Path(), command=obj["command"], **options,
                       **environment_settings())
    rows = batch_job.run_batch(items, base, out_dir, shard_k_n)
    rows, csv_path, json_path = batch_job.write_summaries(rows, out_dir, shard_k_n)
    click.echo(json.dumps(rows, default=str) if as_json else
               f"{batch_job.format_table(rows)}\n\nsummary: {csv_path}, {json_path}")
    failed = [row for row in rows if row["status"] == "failed"]
    if failed:
        names = "; ".join(f"{Path(r['molecule']).name} ({r['error']})" for r in failed)
        raise RunFailure(f"{len(failed)} of {len(rows)} molecules failed: {names}")
    return 0


@cli.command()
@click.argument("molecule", type=XYZ_FILE)
@with_options(*CALCULATION_OPTIONS, *MOLECULE_OPTIONS)
@click.option("--repeat", type=click.IntRange(min=1), default=1, show_default=True,
              help="Timed repeats; medians are reported (the machine may be shared).")
@click.option("--skip-pyscf", is_flag=True, help="Time dfmp2 only.")
@click.option("-o", "--output", type=click.Path(path_type=Path), default=None,
              help="Benchmark record (default: runs/bench-<molecule>-<basis>-<precision>.h5).")
@click.option("--json", "as_json", is_flag=True)
@click.pass_obj
def bench(obj: dict, molecule: Path, repeat: int, skip_pyscf: bool, as_json: bool,
          **options) -> int:
    """Time PySCF's DFMP2 and dfmp2's MP2 stage on the same SCF orbitals."""
    from dfmp2.jobs import bench as benchmark
    settings = RunSettings(molecule=molecule, command=obj["command"], **options,
                           **environment_settings())
    summary, text = benchmark.run_bench(settings, repeat, skip_pyscf)
    click.echo(json.dumps(summary) if as_json else text)
    return 0


@cli.command()
@click.argument("records", nargs=-1, required=True,
                type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--reference", type=click.Choice(["first", "pyscf"]), default="first",
              show_default=True,
              help="Compare with the first record, or with PySCF recomputed from each record's "
                   "settings.")
@click.option("--json", "as_json", is_flag=True)
@VERBOSE
def compare(records: tuple[Path, ...], reference: str, as_json: bool) -> int:
    """Energies of run records side by side, with differences."""
    from dfmp2.jobs import compare as comparison
    pairs = comparison.compare(list(records), reference)
    if as_json:
        click.echo(json.dumps([{"record": row.label, "e_scf": row.e_scf, "e_corr": row.e_corr,
                                "e_tot": row.e_tot,
                                "against": against.label if against else None,
                                "delta_e_corr": row.e_corr - against.e_corr if against else None,
                                "delta_e_tot": row.e_tot - against.e_tot if against else None}
                               for row, against in pairs]))
    else:
        click.echo(printable(comparison.format_table(pairs)))
    return 0


def _raise_interrupted(signum: int, frame) -> None:
    raise Interrupted(f"terminated by signal {signal.Signals(signum).name}; what was finished "
                      "is in the record, and rerunning the same command resumes it",
                      128 + signum)


def main(argv: list[str] | None = None, prog_name: str | None = None) -> None:
    """Entry point: one ``Error:`` line and status 2 for bad usage or input, 1 for failures,
    128 + N after signal N."""
    args = sys.argv[1:] if argv is None else list(argv)
    logging.basicConfig(level=logging.WARNING, format="dfmp2: %(levelname)s: %(message)s",
                        stream=sys.stderr)
    # A file name that is not UTF-8 (kept by Python as surrogate escapes) is printed as \xNN
    # rather than ending a finished run in UnicodeEncodeError under a strict locale.
    with contextlib.suppress(AttributeError, ValueError):
        sys.stdout.reconfigure(errors="backslashreplace")
    os.environ.setdefault(NKI_PLATFORM_ENV, "trn1")
    handled = (signal.SIGTERM, signal.SIGINT)
    in_main_thread = threading.current_thread() is threading.main_thread()
    previous = {s: signal.signal(s, _raise_interrupted) for s in handled} if in_main_thread else {}
    try:
        code = cli.main(args=args, prog_name=prog_name or "dfmp2", standalone_mode=False,
                        obj={"command": shlex.join(["dfmp2", *args])})
    except (click.exceptions.Abort, KeyboardInterrupt):
        click.echo("Error: interrupted", err=True)
        sys.exit(EXIT_SIGINT)
    except click.ClickException as exc:
        click.echo(f"Error: {exc.format_message()}", err=True)
        sys.exit(exc.exit_code)
    except Dfmp2Error as exc:
        click.echo(f"Error: {exc}", err=True)
        sys.exit(exc.exit_code)
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    sys.exit(code if isinstance(code, int) else 0)
