"""``/properties``: what ``dfmp2 properties`` read from the MP2 one-particle density, with the
same numbers for the SCF density in ``/properties/scf``, and their text and JSON views.

Attributes of ``/properties`` are :class:`PropertiesSection`; each of the two groups holds the
datasets of one :class:`DensityProperties` (``/properties`` also the AO density itself, per
spin channel). Units: dipoles in atomic units (e Bohr) and Debye, quadrupoles in atomic units
(e Bohr^2), charges in e, coordinates in Bohr.
"""
from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from dfmp2.records.sections import Section
from dfmp2.records.tree import Node
from dfmp2.system.interrupts import written_whole

# PySCF's e Bohr -> Debye (pyscf.data.nist.AU2DEBYE), written here so that a record can be
# read without PySCF.
AU_TO_DEBYE = 2.541746473
QUADRUPOLE_CONVENTION = ("Buckingham traceless: Theta_ij = 1/2 sum_k q_k (3 r_i r_j - r^2 "
                         "delta_ij), as PySCF's quad_moment")
SCF_GROUP = "scf"
# Natural occupations shown in the text view: those above this (the many nearly empty orbitals
# are left out); the record and --json hold all.
SHOWN_OCCUPATION = 1e-3


@dataclass(frozen=True)
class DensityProperties:
    """What one density gives: dipole (a.u.), traceless quadrupole (a.u.), Mulliken and
    Löwdin charges per atom, and natural occupations (descending) with their orbitals
    (columns, AO basis); for UHF also each spin's natural occupations."""

    dipole_au: np.ndarray
    quadrupole: np.ndarray
    mulliken_charges: np.ndarray
    lowdin_charges: np.ndarray
    natural_occupations: np.ndarray
    natural_orbitals: np.ndarray
    natural_occupations_alpha: np.ndarray | None = None
    natural_occupations_beta: np.ndarray | None = None

    @property
    def dipole_debye(self) -> np.ndarray:
        return AU_TO_DEBYE * np.asarray(self.dipole_au)

    def summary(self) -> dict:
        """The ``--json`` keys of these numbers."""
        values = {"dipole": self.dipole_debye.tolist(),
                  "dipole_au": np.asarray(self.dipole_au).tolist(),
                  "quadrupole": np.asarray(self.quadrupole).tolist(),
                  "mulliken_charges": np.asarray(self.mulliken_charges).tolist(),
                  "lowdin_charges": np.asarray(self.lowdin_charges).tolist(),
                  "natural_occupations": np.asarray(self.natural_occupations).tolist()}
        for spin in ("alpha", "beta"):
            occupations = getattr(self, f"natural_occupations_{spin}")
            if occupations is not None:
                values[f"natural_occupations_{spin}"] = np.asarray(occupations).tolist()
        return values


@dataclass(frozen=True)
class PropertiesSection(Section):
    """``/properties`` attributes: which density (``relaxed`` or ``unrelaxed``) of which
    method, its energy, the origin of the moments (Bohr) and how it was chosen, the
    quadrupole's convention, how the Z-vector was solved (relaxed only) and the Molden file
    written (empty: none)."""

    group_name: ClassVar[str] = "properties"
    method: str
    density: str
    e_tot: float
    e_scf: float
    origin: list
    origin_kind: str
    quadrupole_convention: str = QUADRUPOLE_CONVENTION
    units: str = "dipole a.u. (e Bohr) and Debye; quadrupole a.u. (e Bohr^2); charges e"
    response_solver: str = ""
    response_iterations: int = -1
    response_residual: float = float("nan")
    response_jk_builds: int = 0
    molden: str = ""

    @classmethod
    def read(cls, node: Node) -> "PropertiesSection | None":
        """As :meth:`Section.read`, with the origin (stored as JSON text) as numbers."""
        section = super().read(node)
        if section is None or not isinstance(section.origin, str):
            return section
        return dataclasses.replace(section, origin=json.loads(section.origin))


def _write_values(group: Node, values: DensityProperties) -> None:
    group.datasets.update({name: np.asarray(value)
                           for name, value in dataclasses.asdict(values).items()
                           if value is not None})


def _read_values(group: Node) -> DensityProperties:
    data = group.datasets
    return DensityProperties(**{item.name: (np.asarray(data[item.name]) if item.name in data
                                            else None)
                                for item in dataclasses.fields(DensityProperties)})


@written_whole
def write_properties(node: Node, section: PropertiesSection, mp2: DensityProperties,
                     scf: DensityProperties, densities: list[np.ndarray]) -> None:
    section.write(node)
    group = node.group(PropertiesSection.group_name)
    _write_values(group, mp2)
    group.datasets["density"] = np.asarray(densities)
    _write_values(group.group(SCF_GROUP), scf)


def read_properties(node: Node
                    ) -> tuple[PropertiesSection, DensityProperties, DensityProperties] | None:
    section = PropertiesSection.read(node)
    if section is None:
        return None
    group = node.groups[PropertiesSection.group_name]
    return section, _read_values(group), _read_values(group.groups[SCF_GROUP])


def properties_json(node: Node) -> dict | None:
    """The properties' ``--json`` keys (without ``record``), or None without them."""
    stored = read_properties(node)
    if stored is None:
        return None
    section, mp2, scf = stored
    return {"e_tot": section.e_tot, "e_scf": section.e_scf, "method": section.method,
            "density": section.density, "origin": np.asarray(section.origin).tolist(),
            "origin_kind": section.origin_kind, **mp2.summary(), "scf": scf.summary(),
            "molden": section.molden or None}


def _vector_rows(label: str, mp2: np.ndarray, scf: np.ndarray) -> list[str]:
    rows = [f"  {label}"]
    for axis, a, b in zip("xyz", mp2, scf):
        rows.append(f"    {axis} {a:16.8f} {b:16.8f}")
    rows.append(f"    |mu| {np.linalg.norm(mp2):12.8f} {np.linalg.norm(scf):16.8f}")
    return rows


def _occupation_rows(label: str, occupations: np.ndarray) -> list[str]:
    occupations = np.asarray(occupations)
    shown = occupations[occupations > SHOWN_OCCUPATION]
    rows = [f"  {label} ({len(occupations)}; {len(occupations) - len(shown)} below "
            f"{SHOWN_OCCUPATION:g} not shown):"]
    for start in range(0, len(shown), 8):
        rows.append("    " + " ".join(f"{value:9.6f}" for value in shown[start:start + 8]))
    return rows


def properties_lines(node: Node, symbols: list[str]) -> list[str]:
    """The text view of ``/properties``: each number of the MP2 density beside the SCF's."""
    stored = read_properties(node)
    if stored is None:
        return []
    section, mp2, scf = stored
    origin = " ".join(f"{value:.6f}" for value in section.origin)
    name = section.method.upper()
    lines = [f"  Properties of the {section.density} {name} density (E = {section.e_tot:.10f} "
             "Eh), the SCF density's beside them;",
             f"  moments about the {section.origin_kind} ({origin} Bohr)"
             if section.origin_kind != "given" else f"  moments about ({origin}) Bohr",
             f"  {'':6}{name:>17} {'SCF':>16}",
             *_vector_rows("dipole (Debye)", mp2.dipole_debye, scf.dipole_debye),
             *_vector_rows("dipole (a.u.)", np.asarray(mp2.dipole_au),
                           np.asarray(scf.dipole_au)),
             "  quadrupole (a.u., Buckingham traceless):"]
    for axis, a, b in zip("xyz", mp2.quadrupole, scf.quadrupole):
        lines.append(f"    {axis} " + " ".join(f"{v:12.6f}" for v in a) + "   | "
                     + " ".join(f"{v:12.6f}" for v in b))
    lines.append(f"  {'atom':>6} {'Mulliken':>12} {'SCF':>10} {'Lowdin':>12} {'SCF':>10}")
    natoms = len(mp2.mulliken_charges)
    for number, symbol in enumerate((list(symbols) + [""] * natoms)[:natoms]):
        lines.append(f"  {number + 1:>3} {symbol:<2} {mp2.mulliken_charges[number]:12.6f} "
                     f"{scf.mulliken_charges[number]:10.6f} "
                     f"{mp2.lowdin_charges[number]:12.6f} {scf.lowdin_charges[number]:10.6f}")
    lines += _occupation_rows(f"{name} natural occupations", mp2.natural_occupations)
    for spin in ("alpha", "beta"):
        occupations = getattr(mp2, f"natural_occupations_{spin}")
        if occupations is not None:
            lines += _occupation_rows(f"  {spin}", occupations)
    if section.response_solver:
        lines.append(f"  Z-vector: {section.response_solver}, {section.response_iterations} "
                     f"iterations, {section.response_jk_builds} J/K builds, residual "
                     f"{section.response_residual:.1e}")
    if section.molden:
        lines.append(f"  natural orbitals written to {section.molden} (Molden)")
    return lines
