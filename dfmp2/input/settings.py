"""What the user asked for: the options of one calculation, as given on the command line.

Nothing here reads the environment: the command line (``dfmp2.cli``) turns environment
variables into fields, so the library computes the same thing wherever it is called from.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from dfmp2.mp2.methods import SCS_OS_DEFAULT, SCS_SS_DEFAULT
from dfmp2.input.dispersion import NONE
from dfmp2.input.functionals import named_functional

DEFAULT_OUTPUT_DIR = Path("runs")


@dataclass(frozen=True)
class RunSettings:
    molecule: Path
    basis: str = "cc-pvdz"
    auxbasis: str | None = None
    jk_auxbasis: str | None = None
    """The density-fitted SCF's JK-fit basis (None: the partner of the basis, as PySCF picks)."""
    ecp: str | None = None
    charge: int | None = None
    spin: int | None = None
    frozen_core: bool = False
    frozen: int | None = None
    backend: str = "auto"
    precision: str | None = None
    fused_energy: bool = False
    memory: int | None = None
    scf_method: str = "df"
    scf_engine: str = "kernels"
    reference: str = "auto"
    task: str = "energy"
    method: str = "mp2"
    scs_os: float = SCS_OS_DEFAULT
    scs_ss: float = SCS_SS_DEFAULT
    xc: str | None = None
    mp2_os: float | None = None
    mp2_ss: float | None = None
    dispersion: str | None = None
    """d3bj, d3zero, d4 or none added to a named --xc (None: the functional's own, if any)."""
    grid: int | None = None
    allow_unconverged: bool = False
    stability: bool = False
    """Check a closed-shell reference's internal stability (open shells always are)."""
    check: bool = False
    output: Path | None = None
    threads: int | None = None
    occ_block: int | None = None
    scratch: Path | None = None
    resume: bool = False
    show_progress: bool | None = None
    nki_mode: str | None = None
    require_nki: bool = False
    command: str = "dfmp2 (python API)"

    def xc_suffix(self) -> str:
        """``-<functional>[-<dispersion>]`` in default record names of a double hybrid (``-xc``
        for a custom exchange-correlation string), so they do not replace the MP2 record of the
        molecule, nor the record of the same functional with another dispersion."""
        if self.xc is None:
            return ""
        named = named_functional(self.xc)
        if named is None:
            return "-xc"
        added = (f"-{self.dispersion}" if named.dispersion is None
                 and self.dispersion not in (None, NONE) else "")
        return f"-{named.name.lower()}{added}"

    def output_path(self, suffix: str = "") -> Path:
        """``-o``, else ``runs/<molecule>-<basis>[-<functional>]<suffix>.h5``."""
        if self.output is not None:
            return Path(self.output)
        return DEFAULT_OUTPUT_DIR / (f"{Path(self.molecule).stem}-{self.basis.lower()}"
                                     f"{self.xc_suffix()}{suffix}.h5")
