"""The sections of one calculation's record: each a group whose attributes are a dataclass.

Layout of a run record (schema ``dfmp2.run/1``): the groups ``/input``, ``/versions``,
``/backend``, ``/scf``, ``/sizes``, ``/plan``, ``/checkpoint``, ``/mp2``, ``/timings``,
``/reference`` (with ``--check``), ``/gradient`` and ``/distributed`` (several ranks).
"""
from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from dfmp2.errors import InputError
from dfmp2.input.basis_files import library_name_key
from dfmp2.input.xyz import parse_xyz
from dfmp2.records.tree import FOREIGN_RECORD, Node
from dfmp2.system.files import printable
from dfmp2.system.interrupts import written_whole


# Eh: far beyond any molecule's (a thousand uranium atoms hold about -2.8e7).
LARGEST_ENERGY = 1e15


class Section:
    """A group whose attributes are the fields of a dataclass."""

    group_name: ClassVar[str]

    @written_whole
    def write(self, node: Node) -> None:
        """The fields as attributes; an optional field left at None is not written."""
        node.group(self.group_name).attrs.update(
            {k: v for k, v in dataclasses.asdict(self).items() if v is not None})

    @classmethod
    def read(cls, node: Node):
        """The section in ``node``, or None when the group is absent. Attributes a record of
        an older version lacks take their defaults."""
        group = node.groups.get(cls.group_name)
        if group is None:
            return None
        values = {}
        for item in dataclasses.fields(cls):
            if item.name in group.attrs:
                values[item.name] = from_attr(group.attrs[item.name], item.type,
                                               f"/{cls.group_name} {item.name}")
            elif item.default is dataclasses.MISSING:
                return None
        return cls(**values)


def from_attr(value: Any, annotation: str, where: str) -> Any:
    """An attribute as its field's type; a value of another kind (a record written by
    something else, or altered) is an input error naming the attribute, not a traceback."""
    kind = annotation.removesuffix(" | None")
    if kind not in ("bool", "int", "float", "str"):
        return value
    if kind == "str":
        if isinstance(value, str):
            return value
    elif np.ndim(value) == 0 and not isinstance(value, (str, bytes)):
        number = value.item() if isinstance(value, np.generic) else value
        if kind == "float" and isinstance(number, (int, float)):
            # dfmp2 records an energy only once it is finite, and of a molecule's size: sums
            # and differences of stored ones must stay finite too (+-1.7e308 overflowed).
            if (where.rsplit(" ", 1)[-1].startswith("e_")
                    and not abs(number) <= LARGEST_ENERGY):
                raise InputError(f"the record's {where} holds {number!r}, not a finite "
                                 f"energy; {FOREIGN_RECORD}")
            return float(number)
        # An HDF5 integer attribute is at most 64 bits: a float of 1e308 is no count.
        if (kind == "int" and isinstance(number, (int, float)) and float(number).is_integer()
                and abs(number) < 2**63):
            return int(number)
        if kind == "bool" and isinstance(number, (bool, int)):
            return bool(number)
    expected = {"bool": "a true/false value", "int": "an integer", "float": "a number",
                "str": "text"}[kind]
    raise InputError(f"the record's {where} holds {printable(repr(value)[:40], one_line=True)}, "
                     f"not {expected}; {FOREIGN_RECORD}")


def text_list(value: Any, where: str, what: str) -> list[str]:
    """A stored list of text, which dfmp2 writes as JSON; anything else (an altered record's)
    is an input error naming the attribute and ``what`` dfmp2 writes there."""
    try:
        parsed = json.loads(value) if isinstance(value, str) else None
    except ValueError:
        parsed = None
    if not isinstance(parsed, list) or not all(isinstance(each, str) for each in parsed):
        raise InputError(f"the record's {where} holds "
                         f"{printable(str(value)[:40], one_line=True)}, not {what}; "
                         f"{FOREIGN_RECORD}")
    return parsed


def finite_numbers(value: Any, where: str, shape: tuple[int | None, ...]) -> np.ndarray:
    """A stored dataset as finite fp64 numbers of ``shape`` (None: any length there): dfmp2
    records only such; anything else (text, NaN, another shape) is an input error naming the
    dataset, not a traceback or a NaN passed on."""
    array = np.asarray(value)
    if (array.dtype.kind in "biuf" and array.ndim == len(shape)
            and all(want is None or want == got for want, got in zip(shape, array.shape))):
        array = array.astype(np.float64)
        if np.isfinite(array).all():
            return array
    raise InputError(f"the record's {where} holds {printable(repr(value)[:40], one_line=True)}, "
                     f"not the finite numbers of shape {shape} dfmp2 writes; {FOREIGN_RECORD}")


@dataclass(frozen=True)
class CalculationInputs(Section):
    """``/input``: what was computed and how. Two kinds of comparison use it: a resumed run
    must share ``RESUME_FIELDS`` with the interrupted one (its checkpoint depends on nothing
    else; ``SCALED_FIELDS`` for a checkpoint of scaled energies and gradients), and a
    complete record stands for a new request only when ``REUSE_FIELDS`` match (every option
    that changes a stored number)."""

    group_name: ClassVar[str] = "input"
    RESUME_FIELDS: ClassVar[tuple[str, ...]] = (
        "xyz", "basis", "basis_file", "auxbasis", "auxbasis_file", "ecp", "ecp_file",
        "charge", "spin",
        "ghost_atoms", "scf", "scf_engine", "jk_auxbasis", "jk_auxbasis_file", "reference",
        "frozen", "backend", "precision", "fused_energy", "task", "method", "xc_functional",
        "grid_level", "follow_instability")
    # The scales and the dispersion term are applied after the SCF and the MP2 pair sums, so
    # an interrupted energy's checkpoint holds for any. A checkpoint of the method's own
    # energies and gradients (optimisation steps, displaced points) holds only for the same.
    SCALED_FIELDS: ClassVar[tuple[str, ...]] = RESUME_FIELDS + (
        "scs_os", "scs_ss", "xc", "xc_os", "xc_ss", "dispersion", "dispersion_method",
        "allow_unconverged")
    REUSE_FIELDS: ClassVar[tuple[str, ...]] = SCALED_FIELDS + ("check",)

    xyz: str
    source: str
    basis: str
    auxbasis: str
    auxbasis_option: str = "default"
    ecp: str = "{}"
    jk_auxbasis: str = "none"
    """The SCF's JK-fit basis, as :attr:`auxbasis` names it (``none``: a conventional SCF)."""
    jk_auxbasis_option: str = "default"
    """The ``--jk-auxbasis`` given, or ``default``."""
    basis_file: str = ""
    """``sha256:<hex>`` of the file ``basis`` names, if it names a file (empty: the library's);
    ``auxbasis_file`` and ``jk_auxbasis_file`` likewise."""
    auxbasis_file: str = ""
    jk_auxbasis_file: str = ""
    ecp_file: str = ""
    """``sha256:<hex>`` of the file the core potentials were read from (``--ecp FILE``, or a
    basis file that carries them); empty for the library's."""
    charge: int = 0
    spin: int = 0
    ghost_atoms: str = "[]"
    scf: str = "df"
    scf_engine: str = "pyscf"
    reference: str = "rhf"
    frozen: int = 0
    backend: str = "torch"
    precision: str = "fp64"
    fused_energy: bool = False
    task: str = "energy"
    method: str = "mp2"
    scs_os: float = 1.2
    scs_ss: float = 1.0 / 3.0
    xc: str = ""
    """The double hybrid's name (empty: a Hartree-Fock reference)."""
    xc_functional: str = ""
    """Its exchange-correlation mix as PySCF reads it."""
    xc_os: float = 0.0
    xc_ss: float = 0.0
    grid_level: int = -1
    """PySCF's integration grid level; -1: PySCF's default (or no grid)."""
    dispersion: str = ""
    """The double hybrid's dispersion model (d3bj, d3zero, d4; empty: none)."""
    dispersion_method: str = ""
    """The functional whose damping parameters dftd3/dftd4 supplied."""
    allow_unconverged: bool = False
    follow_instability: bool = False
    """Whether an unstable SCF was followed to a lower solution (``--follow-instability``)."""
    check: bool = False
    basis_warnings: str | None = None
    """The warnings the chosen bases gave (a JSON list; absent where they gave none): an
    orbital basis as a fitting set, a relativistic contraction. Set by the bases, so no part
    of any comparison."""
    memory_bytes: int = 0
    threads: int = 0
    scratch: str = ""

    def differing(self, other: "CalculationInputs", names: tuple[str, ...]) -> list[str]:
        return [name for name in names if self._key(name) != other._key(name)]

    def _key(self, name: str) -> Any:
        """Field ``name`` as compared: a basis the library supplied by its name as PySCF looks
        it up (a record of --basis sto-3g is one of --basis STO-3G), and so the library's
        core potentials (a batch's record of --basis stuttgart stands for --basis
        stuttgart-rlc, one file: compared as text, each listing set the other's record aside
        and computed it again on every run)."""
        value = getattr(self, name)
        if name == "xyz":
            return molecule_key(value)
        if name in LIBRARY_NAMED_FIELDS and not getattr(self, f"{name}_file"):
            return library_name_key(value)
        if name == "ecp" and not self.ecp_file:
            return sorted((element, library_name_key(set_name))
                          for element, set_name in json.loads(value or "{}").items())
        return value


def molecule_key(xyz: str) -> Any:
    """An XYZ text as the molecule it holds: its atoms and their coordinates in Angstrom, to
    the bit. Its comment's charge, multiplicity and units are in those or in the fields
    beside it; the rest is free text, and a note added there made an interrupted run's
    molecule another one, which refused to resume. Text that does not parse is compared as
    it is."""
    try:
        geometry = parse_xyz(xyz)
    except InputError:
        return xyz
    return geometry.symbols, np.ascontiguousarray(geometry.coords, dtype=np.float64).tobytes()


def read_inputs(node: Node) -> CalculationInputs | None:
    return CalculationInputs.read(node)


# The fields that name a basis, each beside its file's digest (``<name>_file``).
LIBRARY_NAMED_FIELDS = ("basis", "auxbasis", "jk_auxbasis")


@dataclass(frozen=True)
class ScfSection(Section):
    """``/scf``: the reference, with its orbitals as datasets."""

    group_name: ClassVar[str] = "scf"
    e_tot: float
    converged: bool
    cycles: int
    method: str
    reference: str
    jk_auxbasis: str
    engine: str = "pyscf"
    xc: str = ""
    """The Kohn-Sham exchange-correlation mix (empty for Hartree-Fock)."""
    grid_level: int = -1
    grid_points: int = 0
    stability: str = "not checked"
    """Stability of the converged reference: ``stable``, ``unstable`` (internally),
    ``undecided`` (a check's Davidson did not converge, its estimate above the line) or ``not
    checked`` (closed shells unless asked, unconverged SCFs, older records)."""
    stability_eigenvalue: float = float("nan")
    """The lowest orbital-Hessian eigenvalue (PySCF's normalisation); NaN when not checked."""
    unpairing_eigenvalue: float = float("nan")
    """A checked closed-shell restricted reference's lowest orbital-Hessian eigenvalue for
    rotations that turn its alpha and beta orbitals apart (PySCF's RHF -> UHF check): below
    -1e-5 a lower unrestricted solution exists. NaN when not checked (open shells, older
    records)."""
    orbital_gradient: float = float("nan")
    """The norm of the orbital gradient at the SCF's last cycle (NaN in older records)."""
    settled: bool = False
    """Whether the SCF ended where it stalled, short of the orbital gradient it aimed at."""
    instabilities_followed: int = 0
    """How many times the SCF's orbitals were rotated along an instability and converged
    again (``--follow-instability``)."""
    s2: float = float("nan")
    """<S^2> of the reference determinant (0 for a closed-shell restricted one; NaN in older
    records)."""
    removed_combinations: int = 0
    """How many combinations of the basis functions the orbitals leave out, the overlap's
    eigenvectors below PySCF's threshold (1e-6 by default) of a nearly linearly dependent basis
    (0 in older records)."""


@dataclass(frozen=True)
class StoredOrbitals:
    mo_energy: np.ndarray
    mo_occ: np.ndarray
    mo_coeff: np.ndarray


@written_whole
def write_scf(node: Node, section: ScfSection, orbitals: StoredOrbitals) -> None:
    section.write(node)
    node.group(ScfSection.group_name).datasets.update(dataclasses.asdict(orbitals))


def read_scf(node: Node) -> tuple[ScfSection, StoredOrbitals | None] | None:
    section = ScfSection.read(node)
    if section is None:
        return None
    datasets = node.groups[ScfSection.group_name].datasets
    if not all(name in datasets for name in ("mo_energy", "mo_occ", "mo_coeff")):
        return section, None
    return section, StoredOrbitals(np.asarray(datasets["mo_energy"]),
                                   np.asarray(datasets["mo_occ"]),
                                   np.asarray(datasets["mo_coeff"]))


@dataclass(frozen=True)
class ScfEngineSection(Section):
    """``/scf_engine``: our J/K engine's tensor (with the AO pairs screened from its fit)
    and every build (seconds, precision and executor, in order); the call counts of its
    kernels go beside them."""

    group_name: ClassVar[str] = "scf_engine"
    engine: str
    builds: int
    build_seconds: list
    build_precisions: list
    build_executors: list
    build_columns: list
    naux: int
    tensor_bytes: int
    out_of_core: bool
    tensor_seconds: float
    mixed_precision: bool
    screened_pairs: int = 0


@dataclass(frozen=True)
class Sizes(Section):
    """``/sizes``: orbital and auxiliary dimensions (``nocc`` and ``nvir`` are alpha's for UHF,
    whose beta counts are ``nocc_beta`` and ``nvir_beta``)."""

    group_name: ClassVar[str] = "sizes"
    nao: int
    naux: int
    naux_fit: int
    nocc: int
    nvir: int
    nfrozen: int
    natoms: int
    nocc_beta: int | None = None
    nvir_beta: int | None = None


@dataclass(frozen=True)
class PlanSection(Section):
    """``/plan``: the occupied blocks, where B lives and the memory budget."""

    group_name: ClassVar[str] = "plan"
    occ_block: int
    occ_blocks: int
    out_of_core: bool
    b_bytes: int
    energy_bytes: int
    build_block_bytes: int
    budget_bytes: int
    metric: str


@dataclass(frozen=True)
class Mp2Section(Section):
    """``/mp2``: MP2, SCS-MP2 (with its scales) and SOS-MP2 energies, plus the parts they were
    formed from (closed shell: direct and exchange; UHF: the two same-spin halves)."""

    group_name: ClassVar[str] = "mp2"
    e_corr: float
    e_os: float
    e_ss: float
    e_scs: float
    e_sos: float
    e_tot: float
    e_tot_scs: float
    e_tot_sos: float
    scs_os_scale: float
    scs_ss_scale: float
    sos_os_scale: float
    direct: float | None = None
    exchange: float | None = None
    e_ss_alpha: float | None = None
    e_ss_beta: float | None = None


@dataclass(frozen=True)
class DoubleHybridSection(Section):
    """``/double_hybrid``: the functional (name, exchange-correlation mix, MP2 scales, source,
    dispersion), the Kohn-Sham grid, and the total E_KS + os_scale E_OS + ss_scale E_SS +
    E_disp. ``/scf`` holds E_KS and ``/mp2`` the unscaled MP2 parts; /mp2's totals are the
    plain sums, not this method's energy."""

    group_name: ClassVar[str] = "double_hybrid"
    name: str
    xc: str
    os_scale: float
    ss_scale: float
    source: str
    grid_level: int
    grid_points: int
    e_ks: float
    e_pt2: float
    e_tot: float
    e_disp: float = 0.0
    """The dispersion energy in e_tot (0 without one, and in records older than it)."""
    dispersion: str = ""
    """How it was computed, e.g. ``D3BJ (dftd3 1.7.0, parameters of b2plyp)``; empty: none."""


@dataclass(frozen=True)
class GradientSection(Section):
    """``/gradient``: the method's total energy and its nuclear gradient (dataset
    ``gradient``, one row [gx, gy, gz] per atom, Eh/Bohr: dE/dR, the negative force);
    ``tensors`` says where its large tensors lived (``memory`` or ``scratch``)."""

    group_name: ClassVar[str] = "gradient"
    method: str
    e_tot: float
    os_scale: float
    ss_scale: float
    response_jk_builds: int
    units: str = "Eh/Bohr"
    tensors: str = "memory"
    response_solver: str = ""
    """How the Z-vector was solved (``minres`` or ``dense``; empty in older records)."""
    response_iterations: int = -1
    response_residual: float = float("nan")
    """||A z - L|| of the Z-vector solution."""


@written_whole
def write_gradient(node: Node, section: GradientSection, gradient: np.ndarray) -> None:
    section.write(node)
    node.group(GradientSection.group_name).datasets["gradient"] = np.asarray(gradient)


def read_gradient(node: Node) -> tuple[GradientSection, np.ndarray] | None:
    section = GradientSection.read(node)
    if section is None:
        return None
    return section, np.asarray(node.groups[GradientSection.group_name].datasets["gradient"])


@dataclass(frozen=True)
class CheckSection(Section):
    """``/reference``: PySCF's DF-MP2 on the same orbitals (``--check``); for a double hybrid,
    PySCF's whole recipe, with its SCF energy and the difference in the total."""

    group_name: ClassVar[str] = "reference"
    program: str
    e_corr: float
    e_os: float
    e_ss: float
    e_tot: float
    delta_e_corr: float
    tolerance: float
    passed: bool
    seconds: float
    e_scf: float | None = None
    delta_e_tot: float | None = None


@written_whole
def write_timings(node: Node, seconds: dict[str, float]) -> None:
    """``/timings``: seconds per stage (``scf``, ``mp2``, ``total`` and finer stages)."""
    node.group("timings").attrs.update(seconds)


def read_timings(node: Node) -> dict[str, float]:
    group = node.groups.get("timings")
    return {} if group is None else {k: float(v) for k, v in group.attrs.items()}


@dataclass(frozen=True)
class Checkpoint:
    """``/checkpoint``: the occupied block size and every finished block pair's weighted
    (direct, exchange) sums, keyed (spin case, i0, i1, j0, j1)."""

    occ_block: int | None
    pairs: dict[tuple[int, ...], tuple[float, float]]


PAIR_KEY_LENGTH = 5


@written_whole
def write_checkpoint(node: Node, checkpoint: Checkpoint) -> None:
    group = node.group("checkpoint")
    if checkpoint.occ_block is not None:
        group.attrs["occ_block"] = checkpoint.occ_block
    keys = sorted(checkpoint.pairs)
    group.datasets["pairs"] = np.array(keys, dtype=np.int64).reshape(-1, PAIR_KEY_LENGTH)
    group.datasets["sums"] = np.array([checkpoint.pairs[k] for k in keys],
                                      dtype=float).reshape(-1, 2)


def read_checkpoint(node: Node) -> Checkpoint | None:
    group = node.groups.get("checkpoint")
    if group is None:
        return None
    occ_block = group.attrs.get("occ_block")
    keys = np.asarray(group.datasets.get("pairs", np.empty((0, PAIR_KEY_LENGTH), dtype=int)))
    sums = np.asarray(group.datasets.get("sums", np.empty((0, 2))))
    if (keys.ndim != 2 or keys.shape[1] != PAIR_KEY_LENGTH or sums.shape != (len(keys), 2)
            or not np.issubdtype(keys.dtype, np.integer)):
        raise ValueError(f"checkpoint pairs of shape {keys.shape} and sums of shape "
                         f"{sums.shape}")
    return Checkpoint(None if occ_block is None else int(occ_block),
                      {tuple(int(v) for v in key): (float(s[0]), float(s[1]))
                       for key, s in zip(keys, sums)})


@written_whole
def write_rank_stages(node: Node, world_size: int, backend: str,
                      stages: list[dict[str, float]], peaks_mb: list[float],
                      points: list[list[int]] | None = None) -> None:
    """``/distributed``: each rank's seconds per stage (``rankK.stage_seconds``, JSON) and its
    peak resident memory (``rankK.peak_rss_mb``), so the balance of the ranks can be seen;
    for a frequency job the displaced points each computed (``rankK.points``)."""
    group = node.group("distributed")
    group.attrs.update({"world_size": world_size, "backend": backend})
    for rank, (seconds, peak) in enumerate(zip(stages, peaks_mb)):
        group.attrs[f"rank{rank}.stage_seconds"] = json.dumps(
            {name: round(value, 6) for name, value in sorted(seconds.items())})
        group.attrs[f"rank{rank}.peak_rss_mb"] = peak
        if points is not None:
            group.attrs[f"rank{rank}.points"] = json.dumps(points[rank])


@written_whole
def write_distributed(node: Node, world_size: int, backend: str,
                      ranks: dict[int, tuple[list, float]], resumed_pairs: int = 0) -> None:
    """``/distributed``: each rank's block pairs and busy seconds, and how many pairs the
    interrupted run that this one resumed had finished (no rank's here; a resumed record
    credited them to none)."""
    group = node.group("distributed")
    group.attrs.update({"world_size": world_size, "backend": backend,
                        "resumed_pairs": resumed_pairs})
    for rank, (pairs, seconds) in ranks.items():
        group.attrs[f"rank{rank}.pairs"] = pairs
        group.attrs[f"rank{rank}.seconds"] = seconds
