"""The `dfmp2` command group; the command modules register their commands on it."""
from __future__ import annotations

import click

from dfmp2 import __version__
from dfmp2.cli.options import VERBOSE


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(version=__version__, prog_name="dfmp2")
@VERBOSE
def cli() -> None:
    """Density-fitted MP2 (RI-MP2) on PySCF orbitals, with NKI and torch kernels."""
