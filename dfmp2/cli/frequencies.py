"""The `frequencies` command: harmonic frequencies, IR intensities and thermochemistry."""
from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path

import click

from dfmp2.cli import views
from dfmp2.cli.calculate import on_every_rank
from dfmp2.cli.group import cli
from dfmp2.cli.options import (CALCULATION_OPTIONS, METHOD, MOLECULE_OPTIONS, XC_OPTIONS,
                               XYZ_FILE, DecimalNumber, environment_settings, molden_option,
                               record_options, refuse_unused_scales, with_options)
from dfmp2.input.settings import RunSettings
from dfmp2.jobs import batch, frequencies
from dfmp2.records import report
from dfmp2.system.files import printable
from dfmp2.vib.displacements import DEFAULT_STEP_BOHR



def parse_shard(text: str | None, environ: Mapping[str, str]) -> tuple[int, int]:
    """``K/N``; ``array`` for this task's position in a Slurm array job; none: the whole
    Hessian."""
    if text is None:
        return 0, 1
    return batch.parse_shard(text, environ)


@cli.command("frequencies")
@click.argument("molecule", type=XYZ_FILE)
@with_options(*CALCULATION_OPTIONS, *XC_OPTIONS, *MOLECULE_OPTIONS)
@METHOD
@click.option("--step", type=DecimalNumber(), default=DEFAULT_STEP_BOHR, show_default=True,
              help="Displacement of each Cartesian coordinate (Bohr).")
@click.option("--temperature", type=DecimalNumber(), default=frequencies.DEFAULT_TEMPERATURE,
              show_default=True, help="Temperature of the thermochemistry (K).")
@click.option("--pressure", type=DecimalNumber(), default=frequencies.DEFAULT_PRESSURE,
              show_default=True, help="Pressure of the thermochemistry (Pa).")
@molden_option("Write the normal modes to this Molden vibration file.")
@click.option("--shard", default=None,
              help="Compute only shard K of N of the displacements (K/N), or 'array' for this "
                   "task's position in a Slurm array; then run without --shard on the same -o "
                   "to assemble the Hessian.")
@with_options(*record_options(
    "Record (default: runs/<molecule>-<basis>-freq.h5).",
    "Print one JSON object: frequencies, IR intensities and thermochemistry."))
@click.pass_obj
def frequencies_command(obj: dict, molecule: Path, step: float, temperature: float,
                        pressure: float, molden: Path | None, shard: str | None, as_json: bool,
                        **options) -> int:
    """Harmonic frequencies (cm^-1), IR intensities (km/mol) and thermochemistry of MOLECULE
    from central differences of the relaxed analytic DF-MP2 (SCS, SOS) gradient and dipole."""
    refuse_unused_scales(options["method"], options["xc"])
    settings = RunSettings(molecule=molecule, command=obj["command"], **options,
                           **environment_settings())
    choice = frequencies.FrequencyOptions(step, temperature, pressure, molden,
                                          parse_shard(shard, os.environ))
    outcome = on_every_rank(frequencies.run, settings, choice)
    if outcome is None:
        return 0
    if as_json:
        views.emit(json.dumps(frequencies.json_summary(outcome)))
    elif outcome.vibrations is None:
        k, n = choice.shard
        shown = printable(str(outcome.path), one_line=True)
        views.emit(f"shard {k}/{n}: {len(outcome.points)} points in {shown}; when every shard "
                   "has finished, run the same command without --shard to assemble the Hessian")
    else:
        views.emit(printable(report.summary(outcome.record)))
        views.emit(f"\nrecord written to {printable(str(outcome.path), one_line=True)}")
        if molden is not None:
            views.emit(f"normal modes written to {printable(str(molden), one_line=True)}")
    return 0
