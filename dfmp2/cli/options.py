"""The option sets the commands share, their parameter types, and the RunSettings fields read
from environment variables."""
from __future__ import annotations

import logging
import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click
from click.core import ParameterSource

import kernels
from kernels.nki.launcher import MODES as NKI_MODES
from dfmp2.errors import Dfmp2Error, InputError
from dfmp2.input.calculation import REFERENCES
from dfmp2.input.dispersion import CHOICES as DISPERSION_CHOICES
from dfmp2.input.functionals import GRID_LEVELS, known_names
from dfmp2.input.settings import scale_factor
from dfmp2.input.xyz import decimal_number
from dfmp2.mp2.methods import METHODS, SCS_OS_DEFAULT, SCS_SS_DEFAULT
from dfmp2.scf.engine import ENGINES
from dfmp2.scf.reference import SCF_METHODS
from dfmp2.system.files import names_a_folder
from dfmp2.system.memory import parse_size

XYZ_FILE = click.Path(exists=True, dir_okay=False, path_type=Path)
REQUIRE_NKI_ENV = "DFMP2_REQUIRE_NKI"
NKI_MODE_ENV = "DFMP2_NKI_MODE"
TRUE_WORDS = ("1", "true", "yes", "on")
FALSE_WORDS = ("", "0", "false", "no", "off")
# The real NKI simulator targets trn3 unless told otherwise; our kernels are written for trn1.
NKI_PLATFORM_ENV = "NEURON_PLATFORM_TARGET_OVERRIDE"
# An integer as typed on a command line: ASCII digits and an optional sign.
ASCII_INTEGER = re.compile(r"[+-]?[0-9]+", re.ASCII)


class AsciiInt(click.IntRange):
    """An integer option, optionally bounded. click converts with int(), which reads 1_0 as
    10 and full-width or other scripts' digits as digits: --charge 1_0 ran a +10 ion."""

    name = "integer"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None):
        if isinstance(value, str) and not ASCII_INTEGER.fullmatch(value.strip()):
            self.fail(f"{value!r} is not an integer (ASCII digits, with an optional sign)",
                      param, ctx)
        return super().convert(value, param, ctx)

    def _describe_range(self) -> str:
        # Unbounded, it is a plain integer: click would show "[x<=None]".
        return "" if self.min is None and self.max is None else super()._describe_range()


class MemorySize(click.ParamType):
    name = "size"

    def convert(self, value: str | int, param: click.Parameter | None,
                ctx: click.Context | None) -> int:
        if isinstance(value, int):
            return value
        try:
            return parse_size(value)
        except Dfmp2Error as exc:
            self.fail(str(exc), param, ctx)


class ScaleFactor(click.ParamType):
    """An energy scale factor (:func:`dfmp2.input.settings.scale_factor`)."""

    name = "number"

    def convert(self, value: Any, param: click.Parameter | None,
                ctx: click.Context | None) -> float:
        try:
            return scale_factor(value)
        except ValueError as exc:
            self.fail(str(exc), param, ctx)


class DecimalNumber(click.ParamType):
    """A number in ASCII decimal or exponent form (:func:`dfmp2.input.xyz.decimal_number`)."""

    name = "number"

    def convert(self, value: Any, param: click.Parameter | None,
                ctx: click.Context | None) -> float:
        if isinstance(value, float):
            return value
        try:
            return decimal_number(str(value))
        except ValueError as exc:
            self.fail(str(exc), param, ctx)


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
    click.option("--jk-auxbasis", default=None,
                 help="Auxiliary (JK-fit) basis of the density-fitted SCF; default: the JK-fit "
                      "partner of --basis (e.g. def2-universal-jkfit)."),
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
                 help="Memory budget, e.g. 4GB (default: 60% of available RAM, within "
                      "the job's memory limit)."),
    click.option("--scf", "scf_method", type=click.Choice(SCF_METHODS), default="df",
                 show_default=True, help="Density-fitted (JK-fit) or conventional SCF."),
    click.option("--scf-engine", type=click.Choice(ENGINES), default="kernels",
                 show_default=True,
                 help="Who builds the density-fitted SCF's J and K: our kernels or PySCF."),
    click.option("--threads", type=AsciiInt(min=1), default=None,
                 help="Threads for torch, PySCF and numpy's BLAS (default: OMP_NUM_THREADS, "
                 "else all available cores; at most the available cores)."),
    click.option("--scs-os", type=ScaleFactor(), default=SCS_OS_DEFAULT, show_default=True,
                 help="SCS-MP2 opposite-spin scale."),
    click.option("--scs-ss", type=ScaleFactor(), default=SCS_SS_DEFAULT, show_default=True,
                 help="SCS-MP2 same-spin scale."),
    click.option("--stability", is_flag=True,
                 help="Check a closed-shell SCF's stability too, internal and toward an "
                      "unrestricted solution (open shells are always checked); an unstable "
                      "reference is reported with a warning."),
    click.option("--follow-instability", is_flag=True,
                 help="When the SCF's reference is internally unstable, rotate its orbitals "
                      "along the instability and converge again, until stable (at most 3 "
                      "times); implies --stability."),
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
    click.option("--dispersion", type=click.Choice(DISPERSION_CHOICES), default=None,
                 help="Dispersion added to a named --xc (dftd3/dftd4 with their parameters for "
                      "it; needs 'dfmp2[dispersion]'); default: the functional's own, if any."),
    click.option("--grid", type=AsciiInt(GRID_LEVELS.start, GRID_LEVELS.stop - 1),
                 default=None, help="PySCF integration grid level for --xc (default: PySCF's, 3)."),
)

def _named_folder(ctx: click.Context, param: click.Parameter, value: str | None
                  ) -> Path | None:
    # Path('') is the current folder, which an empty name does not name.
    if value == "":
        raise click.BadParameter("is empty; name a folder, such as . for this one", ctx, param)
    return None if value is None else Path(value)


MOLECULE_OPTIONS = (
    click.option("--charge", type=AsciiInt(), default=None,
                 help="Total charge (default: 'charge=N' in the XYZ comment, else 0)."),
    click.option("--spin", type=AsciiInt(), default=None,
                 help="2S = N_alpha - N_beta (default: from 'multiplicity=M' in the comment, "
                      "else 0)."),
    click.option("--frozen", type=AsciiInt(min=0), default=None,
                 help="Freeze this many lowest occupied orbitals."),
    click.option("--reference", type=click.Choice(REFERENCES), default="auto",
                 show_default=True,
                 help="SCF reference: RHF for closed shells and UHF for spin > 0 unless given."),
    click.option("--occ-block", type=AsciiInt(min=1), default=None,
                 help="Occupied orbitals per energy block (default: from --memory)."),
    click.option("--scratch", type=click.Path(file_okay=False), default=None,
                 callback=_named_folder,
                 help="Folder for the out-of-core B file (default: beside the record)."),
)

METHOD = click.option("--method", type=click.Choice(METHODS), default="mp2", show_default=True,
                      help="Whose gradient: MP2, SCS-MP2 (with --scs-os/--scs-ss) or SOS-MP2.")


def with_options(*options: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """Apply click option decorators in the order listed (so --help lists them that way)."""
    def decorate(command):
        for option in reversed(options):
            command = option(command)
        return command
    return decorate


def output_option(help_text: str) -> Callable[[Any], Any]:
    """``-o/--output``, a record file's path."""
    return click.option("-o", "--output", type=click.Path(), default=None,
                        callback=_output_file, help=help_text)


def _output_file(ctx: click.Context, param: click.Parameter, value: str | None) -> Path | None:
    return file_path(ctx, param, value, "run.h5")


def molden_option(help_text: str) -> Callable[[Any], Any]:
    """``--molden``, a Molden file's path."""
    return click.option("--molden", type=click.Path(dir_okay=False), default=None,
                        callback=lambda ctx, param, value: file_path(ctx, param, value,
                                                                     "out.molden"),
                        help=help_text)


def file_path(ctx: click.Context, param: click.Parameter, value: str | None,
              example: str) -> Path | None:
    """A file's path as typed, refused when it is empty or names a folder (Path() drops the
    ending)."""
    if value == "":
        raise click.BadParameter(f"is empty; give a file's name, such as {example}", ctx, param)
    if value is not None and names_a_folder(value):
        folder = value if value.endswith(("/", os.sep)) else value + "/"
        raise click.BadParameter(f"{value!r} names a folder; give a file in it, such as "
                                 f"{folder}{example}", ctx, param)
    return None if value is None else Path(value)


def record_options(output_help: str, json_help: str,
                   resumed: str = "run") -> tuple[Callable[[Any], Any], ...]:
    """``-o/--output``, ``--resume`` and ``--json`` of a command that writes a resumable record
    (``resumed`` names what ``--resume`` continues)."""
    return (
        output_option(output_help),
        click.option("--resume", is_flag=True,
                     help=f"Continue the interrupted {resumed} in -o (also done whenever -o "
                          "holds one)."),
        click.option("--json", "as_json", is_flag=True, help=json_help),
    )


def refuse_unused_scales(method: str, xc: str | None) -> None:
    """--scs-os/--scs-ss given to a gradient, density or Hessian of MP2 or SOS-MP2 are
    refused: they were ignored, and a user who meant SCS-MP2 got MP2's numbers. (Beside a
    double hybrid, ``RunSettings`` refuses them for every command.)"""
    if xc is not None or method == "scs-mp2":
        return
    context = click.get_current_context()
    given = [f"--{name.replace('_', '-')}" for name in ("scs_os", "scs_ss")
             if context.get_parameter_source(name) in (ParameterSource.COMMANDLINE,
                                                       ParameterSource.ENVIRONMENT)]
    if given:
        options = " and ".join(given)
        scale, them = ("scale", "them") if len(given) > 1 else ("scales", "it")
        raise click.UsageError(f"{options} {scale} SCS-MP2, and this computes "
                               f"{method.upper()}; add --method scs-mp2, or drop {them}")


def environment_settings() -> dict:
    """The RunSettings fields that come from environment variables; a value that means
    nothing is an error, not taken for the default."""
    mode = os.environ.get(NKI_MODE_ENV, "").strip().lower() or None
    if mode is not None and mode not in NKI_MODES:
        raise InputError(f"{NKI_MODE_ENV}={os.environ[NKI_MODE_ENV]!r} is not an NKI mode; "
                         f"set it to one of {', '.join(NKI_MODES)}, or unset it")
    required = os.environ.get(REQUIRE_NKI_ENV, "").strip().lower()
    if required not in TRUE_WORDS + FALSE_WORDS:
        raise InputError(f"{REQUIRE_NKI_ENV}={os.environ[REQUIRE_NKI_ENV]!r} is neither on nor "
                         "off; set it to 1 or 0, or unset it")
    return {"nki_mode": mode, "require_nki": required in TRUE_WORDS}
