"""What the user asked for: the options of one calculation, as given on the command line.

Nothing here reads the environment: the command line (``dfmp2.cli``) turns environment
variables into fields, so the library computes the same thing wherever it is called from.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dfmp2.errors import InputError
from kernels.nki.launcher import MODES as NKI_MODES
from dfmp2.input.calculation import REFERENCES
from dfmp2.mp2.methods import METHODS, SCS_OS_DEFAULT, SCS_SS_DEFAULT
from dfmp2.scf.engine import ENGINES
from dfmp2.scf.reference import SCF_METHODS
from dfmp2.input.dispersion import NONE
from dfmp2.input.functionals import GRID_LEVELS, MAX_SCALE_FACTOR, named_functional
from dfmp2.input.xyz import decimal_number
from dfmp2.system.memory import checked_size

DEFAULT_OUTPUT_DIR = Path("runs")
SCALE_FIELDS = ("scs_os", "scs_ss", "mp2_os", "mp2_ss")
# Whole-number fields and their least value (None: not given).
COUNT_FIELDS = {"threads": 1, "occ_block": 1, "frozen": 0}
# Jobs built on the analytic gradient of the DF-SCF plus DF-MP2 energy.
DIFFERENTIATING_TASKS = {"gradient": "the gradient", "optimize": "an optimisation",
                         "frequencies": "a frequency job"}
# Fields that name one of a few choices.
CHOICE_FIELDS = {"method": METHODS, "reference": REFERENCES, "scf_method": SCF_METHODS,
                 "scf_engine": ENGINES}


def scale_factor(value: Any) -> float:
    """``value`` as an energy scale factor: a finite number of ordinary size. NaN, infinities
    and huge factors would end up as non-finite or absurd energies, which ``--json`` cannot
    hold. Raises ValueError saying why not."""
    if isinstance(value, bool):
        raise ValueError(f"{value!r} is not a number")
    try:
        number = decimal_number(value) if isinstance(value, str) else float(value)
    except ValueError as exc:
        if "not finite" not in str(exc):
            raise ValueError(f"{value!r} is not a number") from None
        number = math.inf
    except TypeError:
        raise ValueError(f"{value!r} is not a number") from None
    if not math.isfinite(number):
        raise ValueError(f"{value!r} is not a finite number")
    if abs(number) > MAX_SCALE_FACTOR:
        raise ValueError(f"{value!r} is not a scale factor: give a number between "
                         f"-{MAX_SCALE_FACTOR:g} and {MAX_SCALE_FACTOR:g}")
    return number


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
    """Check a closed-shell reference's stability, internal and toward an unrestricted
    solution (open shells are always checked, internally)."""
    follow_instability: bool = False
    """Converge an unstable reference again from its orbitals rotated along the instability,
    until stable (implies ``stability``)."""
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

    def __post_init__(self) -> None:
        """The numbers every interface (command line, QCSchema, ASE, Python) must respect,
        checked here so that none of them can pass what the command line refuses."""
        for item in dataclasses.fields(self):
            value = getattr(self, item.name)
            if isinstance(value, (str, Path)) and "\x00" in str(value):
                # No file name can hold one (a manifest line's basis ended a batch in
                # "ValueError: embedded null byte" when its record was opened).
                raise InputError(f"{item.name} {str(value)!r} holds a NUL byte; remove it")
        for name in SCALE_FIELDS:
            value = getattr(self, name)
            if value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise InputError(f"{name} {value!r} must be a number")
            try:
                scale_factor(value)
            except ValueError as exc:
                raise InputError(f"{name}: {exc}") from None
        for name in ("charge", "spin"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
                raise InputError(f"{name} {value!r} must be a whole number")
        if self.nki_mode is not None and self.nki_mode not in NKI_MODES:
            raise InputError(f"nki_mode {self.nki_mode!r}: choose one of {', '.join(NKI_MODES)}")
        for name, choices in CHOICE_FIELDS.items():
            if getattr(self, name) not in choices:
                raise InputError(f"{name} {getattr(self, name)!r}: choose one of "
                                 f"{', '.join(choices)}")
        for name, least in COUNT_FIELDS.items():
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int)
                                      or value < least):
                raise InputError(f"{name} {value!r} must be a whole number of at least "
                                 f"{least}")
        if self.grid is not None and (isinstance(self.grid, bool) or self.grid not in GRID_LEVELS):
            raise InputError(f"grid {self.grid!r} must be a grid level from {GRID_LEVELS.start} "
                             f"to {GRID_LEVELS.stop - 1}")
        if self.memory is not None:
            if isinstance(self.memory, bool) or not isinstance(self.memory, int):
                raise InputError(f"memory {self.memory!r} must be a number of bytes")
            checked_size(self.memory)
        self._refuse_scs_scales_beside_a_double_hybrid()
        self._refuse_scs_scales_of_another_method()
        if self.task in DIFFERENTIATING_TASKS and self.scf_method != "df":
            # Refused here, before any record is touched: found after the SCF, it had moved
            # a complete record aside for a job that could not run.
            raise InputError(f"{DIFFERENTIATING_TASKS[self.task]} needs a density-fitted SCF "
                             "(--scf df): the energy it differentiates is DF-SCF plus DF-MP2")

    def _refuse_scs_scales_beside_a_double_hybrid(self) -> None:
        """A double hybrid reports its own MP2 share (--mp2-os, --mp2-ss), no SCS-MP2: SCS
        scales beside --xc were dropped without a word, and a user who meant them got the
        functional's numbers."""
        given = [f"--{name.replace('_', '-')}" for name, value, default in
                 (("scs_os", self.scs_os, SCS_OS_DEFAULT), ("scs_ss", self.scs_ss, SCS_SS_DEFAULT))
                 if value != default]
        if self.xc is None or not given:
            return
        options = " and ".join(given)
        scale, them = ("scale", "them") if len(given) > 1 else ("scales", "it")
        raise InputError(f"{options} {scale} SCS-MP2, not the double hybrid --xc {self.xc}; "
                         f"drop {them} (a custom --xc takes --mp2-os and --mp2-ss)")

    def _refuse_scs_scales_of_another_method(self) -> None:
        """A gradient, density or Hessian of MP2 or SOS-MP2 has no SCS-MP2 energy to report
        beside it, as an energy run does: scales given to one (QCSchema's scs_os with the
        gradient driver) were dropped without a word. The command line, QCSchema and the ASE
        calculator refuse them earlier, also at their default values, which only they can
        tell from not given; this holds for every other caller."""
        if self.task == "energy" or self.xc is not None or self.method == "scs-mp2":
            return
        given = [f"--{name.replace('_', '-')}" for name, value, default in
                 (("scs_os", self.scs_os, SCS_OS_DEFAULT), ("scs_ss", self.scs_ss, SCS_SS_DEFAULT))
                 if value != default]
        if given:
            options = " and ".join(given)
            scale, them = ("scale", "them") if len(given) > 1 else ("scales", "it")
            raise InputError(f"{options} {scale} SCS-MP2, and this computes "
                             f"{self.method.upper()}; ask for the method scs-mp2, or drop "
                             f"{them}")

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
        return DEFAULT_OUTPUT_DIR / (f"{Path(self.molecule).stem}-{self.basis_label()}"
                                     f"{self.xc_suffix()}{suffix}.h5")

    def basis_label(self) -> str:
        """The basis in default record names: its name, or a basis file's own name (a path's
        folders made the record's name a path into folders that do not exist)."""
        return Path(self.basis).name.lower()
