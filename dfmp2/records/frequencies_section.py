"""The sections of a frequencies record (schema ``dfmp2.frequencies/1``).

Beside ``/input`` and the calculation at the input geometry (``/scf`` with its orbitals,
``/mp2`` and ``/gradient``, as ``dfmp2 gradient`` writes them) it holds:

- ``/displacements``: every finished point of the central differences, saved as it finishes
  (datasets ``index``, ``coords`` in Bohr, ``energies``, ``gradients`` in Eh/Bohr, ``dipoles``
  in e Bohr) and what they were computed for (attributes: the method, its scales, the step,
  the number of points, the shard);
- ``/frequencies``: the harmonic analysis (datasets ``hessian``, the symmetrised Cartesian
  Hessian in Eh/Bohr^2, ``frequencies`` in cm^-1, ``ir_intensities`` in km/mol,
  ``normal_modes`` in amu^-1/2, ``reduced_masses`` in amu, ``force_constants``, the
  mass-weighted Hessian's eigenvalues in Eh Bohr^-2 amu^-1, ``dipole_derivatives``) and the
  thermochemistry in its attributes.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from dfmp2.records.sections import (DoubleHybridSection, GradientSection, Mp2Section, ScfSection,
                                    Section, StoredOrbitals, finite_numbers, write_gradient,
                                    write_scf)
from dfmp2.records.tree import Node
from dfmp2.vib.analysis import STATIONARY_MAX_GRADIENT, Thermochemistry, not_stationary
from dfmp2.vib.symmetry import SYMMETRY_TOLERANCE_BOHR
from dfmp2.system.interrupts import written_whole

ANALYSIS_DATASETS = ("hessian", "frequencies", "ir_intensities", "normal_modes",
                     "reduced_masses", "force_constants", "dipole_derivatives")
# The thermochemistry's numbers, which every record holds (the symmetry number came later),
# whether the annotations are strings or types.
THERMOCHEMISTRY_NUMBERS = tuple(item.name for item in dataclasses.fields(Thermochemistry)
                                if item.type in ("float", float))


@dataclass(frozen=True)
class Point:
    """One finished point: its index (0 the input geometry; see
    :mod:`dfmp2.vib.displacements`), coordinates (Bohr), the method's energy (Eh), gradient
    (Eh/Bohr) and relaxed dipole (e Bohr)."""

    index: int
    coords: np.ndarray
    energy: float
    gradient: np.ndarray
    dipole: np.ndarray


@dataclass(frozen=True)
class ReferenceSections:
    """What the record keeps of the calculation at the input geometry."""

    scf: ScfSection
    orbitals: StoredOrbitals
    mp2: Mp2Section
    gradient: GradientSection
    gradient_values: np.ndarray
    double_hybrid: DoubleHybridSection | None = None
    """A double hybrid's energies: without them the record reads as MP2 on Kohn-Sham
    orbitals (compare and show gave E_KS plus the unscaled correlation as its total)."""


@dataclass(frozen=True)
class DisplacementSection(Section):
    """``/displacements`` attributes: what the points were computed for. Points are reused
    only for the same scales; a point counts only where its geometry is the one the step
    asks for."""

    group_name: ClassVar[str] = "displacements"
    method: str
    os_scale: float
    ss_scale: float
    step: float
    points: int
    """Points of the whole Hessian: 1 + 6N."""
    shard: str = "0/1"


@dataclass(frozen=True)
class FrequenciesSection(Section):
    """``/frequencies`` attributes: the analysis and the thermochemistry. The thermochemistry's
    fields are attributes of the group itself, beside the others, as records have always held
    them."""

    group_name: ClassVar[str] = "frequencies"
    method: str
    e_tot: float
    step: float
    thermochemistry: Thermochemistry
    imaginary: int
    linear: bool
    rigid_modes: int
    hessian_asymmetry: float
    """max |H - H^T| of the central differences before symmetrisation (Eh/Bohr^2)."""
    max_gradient: float
    """max |dE/dR| at the input geometry (Eh/Bohr)."""
    molden: str = ""

    @written_whole
    def write(self, node: Node) -> None:
        """The fields as attributes, the thermochemistry's among them in its place."""
        attrs = {}
        for name, value in dataclasses.asdict(self).items():
            attrs.update(value if name == "thermochemistry" else {name: value})
        node.group(self.group_name).attrs.update(attrs)

    @classmethod
    def read(cls, node: Node) -> FrequenciesSection | None:
        """The section in ``node``, or None when the group or a field without default is
        absent."""
        group = node.groups.get(cls.group_name)
        if group is None or any(name not in group.attrs for name in THERMOCHEMISTRY_NUMBERS):
            return None
        thermochemistry = Thermochemistry(
            **{name: float(group.attrs[name]) for name in THERMOCHEMISTRY_NUMBERS},
            symmetry_number=int(group.attrs.get("symmetry_number", 0)))
        # Section.read takes each field from the attribute of its name: give it one.
        nested = Node(attrs={**group.attrs, "thermochemistry": thermochemistry})
        return super().read(Node(groups={cls.group_name: nested}))


@written_whole
def write_points(node: Node, section: DisplacementSection, points: list[Point]) -> None:
    """``/displacements`` with ``points`` in index order."""
    section.write(node)
    ordered = sorted(points, key=lambda p: p.index)
    natm = (section.points - 1) // 6
    node.group(DisplacementSection.group_name).datasets.update({
        "index": np.array([p.index for p in ordered], dtype=np.int64),
        "coords": np.array([p.coords for p in ordered]).reshape(-1, natm, 3),
        "energies": np.array([p.energy for p in ordered], dtype=float),
        "gradients": np.array([p.gradient for p in ordered]).reshape(-1, natm, 3),
        "dipoles": np.array([p.dipole for p in ordered]).reshape(-1, 3)})


def read_points(node: Node | None) -> tuple[DisplacementSection, list[Point]] | None:
    section = None if node is None else DisplacementSection.read(node)
    if section is None:
        return None
    data = node.groups[DisplacementSection.group_name].datasets
    if "index" not in data:
        return section, []
    where = f"/{DisplacementSection.group_name}"
    index = finite_numbers(data["index"], f"{where} index", (None,)).astype(np.int64)
    count, natm = len(index), (section.points - 1) // 6
    coords, gradients = (finite_numbers(data.get(name), f"{where} {name}", (count, natm, 3))
                         for name in ("coords", "gradients"))
    energies = finite_numbers(data.get("energies"), f"{where} energies", (count,))
    dipoles = finite_numbers(data.get("dipoles"), f"{where} dipoles", (count, 3))
    return section, [Point(int(i), c, float(e), g, d)
                     for i, c, e, g, d in zip(index, coords, energies, gradients, dipoles)]


@written_whole
def write_reference(node: Node, reference: ReferenceSections) -> None:
    write_scf(node, reference.scf, reference.orbitals)
    reference.mp2.write(node)
    write_gradient(node, reference.gradient, reference.gradient_values)
    if reference.double_hybrid is not None:
        reference.double_hybrid.write(node)


def has_reference(node: Node | None) -> bool:
    return node is not None and GradientSection.group_name in node.groups


@written_whole
def copy_reference(source: Node, target: Node) -> None:
    """The input geometry's calculation of another record of the same inputs (an interrupted
    run's, a shard's) into ``target``."""
    for name in (ScfSection.group_name, Mp2Section.group_name, GradientSection.group_name,
                 DoubleHybridSection.group_name):
        if name in source.groups:
            target.groups[name] = source.groups[name]


@written_whole
def write_frequencies(node: Node, section: FrequenciesSection,
                      arrays: dict[str, np.ndarray]) -> None:
    section.write(node)
    node.group(FrequenciesSection.group_name).datasets.update(
        {name: np.asarray(arrays[name]) for name in ANALYSIS_DATASETS})


def read_frequencies(node: Node) -> tuple[FrequenciesSection, dict[str, np.ndarray]] | None:
    section = FrequenciesSection.read(node)
    if section is None:
        return None
    data = node.groups[FrequenciesSection.group_name].datasets
    return section, {name: np.asarray(data[name]) for name in ANALYSIS_DATASETS if name in data}


def frequency_lines(root: Node) -> list[str]:
    """The frequency table and thermochemistry of a frequencies record, for `show` and
    `dfmp2 frequencies`."""
    stored = read_frequencies(root)
    if stored is None:
        return []
    section, data = stored
    lines = [f"  {section.method.upper()} harmonic frequencies: central differences of the "
             f"analytic gradient, step {section.step:g} Bohr; {section.rigid_modes} "
             "translations and rotations projected out",
             f"  {'mode':>6} {'cm^-1':>12} {'IR km/mol':>12} {'mass amu':>10}"]
    for number, (frequency, intensity, mass) in enumerate(
            zip(data["frequencies"], data["ir_intensities"], data["reduced_masses"]), start=1):
        lines.append(f"  {number:>6} {frequency:12.2f} {intensity:12.4f} {mass:10.4f}")
    thermo = section.thermochemistry
    if section.imaginary:
        lines.append(f"  Warning: {section.imaginary} imaginary (negative) frequenc"
                     f"{'y' if section.imaginary == 1 else 'ies'}: the geometry is not a "
                     "minimum")
    if section.max_gradient > STATIONARY_MAX_GRADIENT:
        lines.append(f"  Warning: {not_stationary(section.max_gradient)}")
    lines += [f"  thermochemistry at {thermo.temperature:g} K and {thermo.pressure:g} Pa "
              "(ideal gas, rigid rotor, harmonic oscillator):",
              f"  {'E_tot':<8} {section.e_tot:20.10f} Eh",
              f"  {'ZPE':<8} {thermo.zpe:20.10f} Eh",
              f"  {'H':<8} {thermo.enthalpy:20.10f} Eh",
              f"  {'S':<8} {thermo.entropy:20.10e} Eh/K",
              f"  {'G':<8} {thermo.gibbs:20.10f} Eh"]
    if thermo.symmetry_number:
        lines.append(f"  rotational symmetry number {thermo.symmetry_number} (proper rotations "
                     f"onto the molecule within {SYMMETRY_TOLERANCE_BOHR:g} Bohr)")
    return lines
