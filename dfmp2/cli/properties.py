"""The ``properties`` command: the MP2 density's dipole, quadrupole, charges and natural
orbitals, beside the SCF density's."""
from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path
from typing import Any

import click
import numpy as np
from pyscf.data.nist import BOHR

from dfmp2.cli import views
from dfmp2.cli.calculate import on_every_rank
from dfmp2.cli.group import cli
from dfmp2.cli.options import (CALCULATION_OPTIONS, MOLECULE_OPTIONS, XC_OPTIONS, XYZ_FILE,
                               environment_settings, molden_option, record_options,
                               refuse_unused_scales,
                               with_options)
from dfmp2.input.settings import RunSettings
from dfmp2.input.xyz import DECIMAL_NUMBER, MAX_COORDINATE_ANGSTROM
from dfmp2.jobs import properties
from dfmp2.mp2.methods import METHODS


class Origin(click.ParamType):
    """``x,y,z`` in Angstrom, as three finite numbers; given back in Bohr."""

    name = "x,y,z"

    def convert(self, value: Any, param: click.Parameter | None,
                ctx: click.Context | None) -> np.ndarray:
        if isinstance(value, np.ndarray):
            return value
        parts = [part.strip() for part in str(value).split(",")]
        # As the XYZ reader's coordinates: float() also took '1_0' for 10.
        numbers = ([float(part) for part in parts]
                   if all(DECIMAL_NUMBER.fullmatch(part) for part in parts) else [])
        if len(numbers) != 3 or not all(math.isfinite(n) for n in numbers):
            self.fail(f"{value!r} is not three finite numbers x,y,z (Angstrom)", param, ctx)
        if max(abs(n) for n in numbers) > MAX_COORDINATE_ANGSTROM:
            self.fail(f"{value!r} lies beyond {MAX_COORDINATE_ANGSTROM:g} Angstrom, where the "
                      "moments about it overflow; give an origin near the molecule", param, ctx)
        return np.asarray(numbers) / BOHR


@cli.command("properties")
@click.argument("molecule", type=XYZ_FILE)
@with_options(*CALCULATION_OPTIONS, *XC_OPTIONS, *MOLECULE_OPTIONS)
@click.option("--method", type=click.Choice(METHODS), default="mp2", show_default=True,
              help="Whose density: MP2, SCS-MP2 (with --scs-os/--scs-ss) or SOS-MP2.")
@click.option("--density", "density_kind", type=click.Choice(["relaxed", "unrelaxed"]),
              default="relaxed", show_default=True,
              help="The relaxed density (the energy's derivative, with the orbital response) "
                   "or the unrelaxed one.")
@click.option("--origin", type=Origin(), default=None,
              help="Origin of the moments, x,y,z in Angstrom (default: the centre of nuclear "
                   "charge).")
@molden_option("Write the natural orbitals with their occupations to this Molden file.")
@with_options(*record_options(
    "Record path (default: runs/<molecule>-<basis>-properties.h5).",
    "Print one JSON object: e_tot, density, dipole (Debye), dipole_au, quadrupole, charges, "
    "natural occupations, and the SCF's under scf."))
@click.pass_obj
def properties_command(obj: dict, molecule: Path, density_kind: str, origin: np.ndarray | None,
                       molden: Path | None, as_json: bool, **options) -> int:
    """Dipole, quadrupole, Mulliken and Löwdin charges and natural orbitals of the relaxed
    (or unrelaxed) DF-MP2 (SCS, SOS) density of MOLECULE, beside the SCF density's."""
    refuse_unused_scales(options["method"], options["xc"])
    settings = RunSettings(molecule=molecule, command=obj["command"], task=properties.TASK,
                           **options, **environment_settings())
    if settings.output is None:
        settings = replace(settings, output=settings.output_path("-properties"))
    request = properties.PropertiesRequest(density_kind == "relaxed", origin, molden)
    outcome = on_every_rank(properties.run, settings, request)
    if outcome is None:
        return 0
    views.print_properties(outcome.record, outcome.path, as_json)
    return outcome.exit_code
