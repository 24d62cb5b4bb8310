"""The commands that compute one molecule or dimer: run, gradient, optimize and interaction."""
from __future__ import annotations

import json
import logging
import os
from dataclasses import replace
from pathlib import Path
from typing import Callable, TypeVar

import click

from dfmp2.cli import views
from dfmp2.cli.group import cli
from dfmp2.cli.options import (AsciiInt, CALCULATION_OPTIONS, METHOD, MOLECULE_OPTIONS, XC_OPTIONS,
                               XYZ_FILE, environment_settings, output_option,
                               record_options, refuse_unused_scales, with_options)
from dfmp2.input.settings import RunSettings
from dfmp2.jobs import interaction, optimize, run
from dfmp2.system import distributed

Outcome = TypeVar("Outcome")


@cli.command("run")
@click.argument("molecule", type=XYZ_FILE)
@with_options(*CALCULATION_OPTIONS, *XC_OPTIONS, *MOLECULE_OPTIONS)
@click.option("--allow-unconverged", is_flag=True, help="Accept an unconverged SCF.")
@click.option("--check", is_flag=True,
              help="Also run PySCF's DFMP2 on the same orbitals; exit 1 if they disagree.")
@with_options(*record_options("Run record path (default: runs/<molecule>-<basis>.h5).",
                              "Print one JSON object instead of text."))
@click.option("--qcschema", "as_qcschema", is_flag=True,
              help="Print the QCSchema AtomicResult as JSON (needs dfmp2[qcschema]).")
@click.option("--qcschema-version", type=click.Choice(["1", "2"]), default=None,
              help="QCSchema version printed by --qcschema (default 1: what "
                   "qcelemental.models.AtomicResult reads and QCEngine returns for a dict "
                   "input).")
@click.pass_obj
def run_command(obj: dict, molecule: Path, as_json: bool, as_qcschema: bool,
                qcschema_version: str | None, **options) -> int:
    """Compute the DF-MP2 (or double-hybrid) energy of MOLECULE (an XYZ file) and write a run
    record."""
    settings = RunSettings(molecule=molecule, command=obj["command"], **options,
                           **environment_settings())
    if as_json and as_qcschema:
        raise click.UsageError("give --json or --qcschema, not both")
    if qcschema_version is not None and not as_qcschema:
        raise click.UsageError("--qcschema-version goes with --qcschema")
    qcschema = views.qcschema_module() if as_qcschema else None
    outcome = on_every_rank(run.run, settings)
    if outcome is None:
        return 0
    if qcschema is not None:
        views.print_qcschema(qcschema, settings, outcome, qcschema_version)
    else:
        views.print_outcome(outcome, as_json)
    return outcome.exit_code


def refuse_ranks(command: str) -> None:
    """``command`` runs as one process: under torchrun or srun every rank ran the whole job
    on one record, the loser of the lock said another run held it, and torchrun then stopped
    the winner, leaving no result."""
    if distributed.launch_from(os.environ).size > 1:
        raise click.UsageError(f"dfmp2 {command} runs as one process; start it without "
                               "torchrun or srun (run, gradient, properties, frequencies and "
                               "batch spread over ranks)")


def on_every_rank(job: Callable[..., Outcome], settings: RunSettings,
                  *arguments) -> Outcome | None:
    """``job(settings, *arguments, world)``; under torchrun or srun every rank joins it, and
    only rank 0 gets the outcome to print (the other ranks stay quiet and get None)."""
    world = distributed.init_world(distributed.launch_from(os.environ))
    try:
        if not world.is_root:
            logging.getLogger().setLevel(logging.ERROR)
            settings = replace(settings, show_progress=False)
        outcome = job(settings, *arguments, world)
    except BaseException:
        world.close(failed=True)
        raise
    world.close()
    return outcome if world.is_root else None


@cli.command("gradient")
@click.argument("molecule", type=XYZ_FILE)
@with_options(*CALCULATION_OPTIONS, *MOLECULE_OPTIONS, *XC_OPTIONS)
@METHOD
@with_options(*record_options(
    "Record path (default: runs/<molecule>-<basis>-gradient.h5).",
    "Print one JSON object: e_tot (the method's energy) and gradient."))
@click.pass_obj
def gradient_command(obj: dict, molecule: Path, as_json: bool, **options) -> int:
    """The relaxed analytic DF-MP2 (SCS, SOS) or double-hybrid gradient of MOLECULE, in
    Eh/Bohr."""
    refuse_unused_scales(options["method"], options["xc"])
    settings = RunSettings(molecule=molecule, command=obj["command"], task="gradient",
                           **options, **environment_settings())
    if settings.output is None:
        settings = replace(settings, output=settings.output_path("-gradient"))
    outcome = on_every_rank(run.run, settings)
    if outcome is None:
        return 0
    views.print_outcome(outcome, as_json)
    return outcome.exit_code


@cli.command("optimize")
@click.argument("molecule", type=XYZ_FILE)
@with_options(*CALCULATION_OPTIONS, *MOLECULE_OPTIONS, *XC_OPTIONS)
@METHOD
@click.option("--convergence", default="GAU", show_default=True,
              type=click.Choice(["GAU", "GAU_TIGHT", "GAU_VERYTIGHT", "GAU_LOOSE",
                                 "NWCHEM_LOOSE", "TURBOMOLE", "INTERFRAG_TIGHT"],
                                case_sensitive=False),
              help="geomeTRIC's convergence criteria.")
@click.option("--max-steps", type=AsciiInt(min=1, max=optimize.MAX_STEPS_LIMIT),
              default=optimize.DEFAULT_MAX_STEPS, show_default=True)
@with_options(*record_options(
    "Record (default: runs/<molecule>-<basis>-opt.h5); the final geometry goes beside it as "
    ".xyz.", "Print one JSON object: the final energy and geometry.", resumed="optimisation"))
@click.pass_obj
def optimize_command(obj: dict, molecule: Path, convergence: str, max_steps: int,
                     as_json: bool, **options) -> int:
    """Optimise the geometry of MOLECULE with geomeTRIC on the DF-MP2 (SCS, SOS) or
    double-hybrid gradient."""
    refuse_ranks("optimize")
    refuse_unused_scales(options["method"], options["xc"])
    settings = RunSettings(molecule=molecule, command=obj["command"], **options,
                           **environment_settings())
    outcome = optimize.run(settings, convergence, max_steps)
    views.emit(json.dumps(optimize.json_summary(outcome)) if as_json
               else optimize.format_summary(outcome))
    return 0


@cli.command("interaction")
@click.argument("dimer", type=XYZ_FILE)
@with_options(*CALCULATION_OPTIONS, *XC_OPTIONS)
@click.option("--split", type=AsciiInt(min=1), default=None,
              help="Monomer A is the first N atoms (default: 'monomer A = first N atoms' in the "
                   "comment line).")
@click.option("--charges", default=None, help="Monomer charges a,b (default 0,0).")
@click.option("--spins", default=None, help="Monomer spins (2S) a,b (default 0,0).")
@output_option("Record (default: runs/<dimer>-<basis>-interaction.h5).")
@click.option("--json", "as_json", is_flag=True)
@click.pass_obj
def interaction_command(obj: dict, dimer: Path, split: int | None, charges: str | None,
                        spins: str | None, output: Path | None, as_json: bool,
                        **options) -> int:
    """Counterpoise-corrected (and uncorrected) SCF, MP2 and SCS-MP2 interaction energies."""
    refuse_ranks("interaction")
    settings = RunSettings(molecule=dimer, command=obj["command"], **options,
                           **environment_settings())
    outcome = interaction.run_interaction(settings, split,
                                          interaction.parse_pair(charges, "--charges"),
                                          interaction.parse_pair(spins, "--spins"), output)
    views.emit(json.dumps(interaction.json_summary(outcome.record, outcome.path)) if as_json
               else interaction.format_table(outcome.record, outcome.path))
    return 0
