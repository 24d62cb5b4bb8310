"""The sections of the other commands' records: an optimisation's steps, an interaction's
calculations and energies, a benchmark's figures. An interaction record holds one
calculation tree per calculation plus ``/interaction``; a benchmark record holds ``/bench``
and ``/runs``.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from dfmp2.records.sections import Mp2Section, ScfSection, Section, finite_numbers
from dfmp2.records.tree import Node
from dfmp2.system.interrupts import written_whole


@dataclass(frozen=True)
class Steps:
    """``/optimize`` datasets: every optimisation step's coordinates (Bohr), energy (Eh) and
    gradient (Eh/Bohr), in order."""

    coords: np.ndarray
    energies: np.ndarray
    gradients: np.ndarray

    @classmethod
    def empty(cls, natoms: int) -> "Steps":
        return cls(np.empty((0, natoms, 3)), np.empty(0), np.empty((0, natoms, 3)))


@dataclass(frozen=True)
class OptimizationSection(Section):
    """``/optimize`` attributes: how the optimisation ended."""

    group_name: ClassVar[str] = "optimize"
    converged: bool
    convergence_set: str
    criteria: str
    max_steps: int
    steps: int
    replayed_steps: int
    e_tot: float
    final_xyz: str
    xyz_path: str


@written_whole
def write_steps(node: Node, steps: Steps) -> None:
    node.group(OptimizationSection.group_name).datasets.update(dataclasses.asdict(steps))


def read_steps(node: Node | None) -> Steps | None:
    group = None if node is None else node.groups.get(OptimizationSection.group_name)
    if group is None or "coords" not in group.datasets:
        return None
    data = group.datasets
    energies = finite_numbers(data.get("energies"), "/optimize energies", (None,))
    coords = finite_numbers(data.get("coords"), "/optimize coords", (len(energies), None, 3))
    gradients = finite_numbers(data.get("gradients"), "/optimize gradients", coords.shape)
    return Steps(coords, energies, gradients)


@written_whole
def write_optimization(node: Node, section: OptimizationSection) -> None:
    section.write(node)


def calculation_node(root: Node, name: str) -> Node:
    """The subtree of one calculation of an interaction record (``dimer``, ``monomer_a_cp``
    ...), laid out like a run record."""
    return root.group(name)


def calculation_names(root: Node) -> list[str]:
    return [name for name, child in root.groups.items() if Mp2Section.group_name in child.groups
            or ScfSection.group_name in child.groups]


@dataclass(frozen=True)
class InteractionInputs(Section):
    group_name: ClassVar[str] = "input"
    xyz: str
    source: str
    split: int
    charges: str
    spins: str
    basis: str
    frozen_core: bool


@written_whole
def write_interaction(root: Node, energies: dict[str, tuple[float, float]],
                      kcal_per_hartree: float) -> None:
    """``/interaction``: for each kind (scf, mp2, scs, sos) the counterpoise-corrected and
    uncorrected interaction energies in Eh and kcal/mol, and the BSSE as uncorrected minus
    corrected (negative where the uncorrected energy overbinds)."""
    group = root.group("interaction")
    for kind, (cp, nocp) in energies.items():
        group.attrs.update({f"e_int_{kind}_cp": cp, f"e_int_{kind}_nocp": nocp,
                            f"e_int_{kind}_cp_kcal": cp * kcal_per_hartree,
                            f"e_int_{kind}_nocp_kcal": nocp * kcal_per_hartree,
                            f"bsse_{kind}": nocp - cp})


def read_interaction(root: Node) -> dict[str, float] | None:
    """Every ``/interaction`` value by its name (``e_int_mp2_cp`` ...), as the JSON output
    gives them."""
    group = root.groups.get("interaction")
    return None if group is None else {k: float(v) for k, v in group.attrs.items()}


def interaction_value(values: dict[str, float], kind: str, corrected: bool,
                      kcal: bool = False) -> float:
    return values[f"e_int_{kind}_{'cp' if corrected else 'nocp'}{'_kcal' if kcal else ''}"]


@written_whole
def write_bench(root: Node, summary: dict[str, Any], runs: dict[str, np.ndarray],
                stage_timings: list[dict[str, float]]) -> None:
    root.group("bench").attrs.update(summary)
    root.group("runs").datasets.update(runs)
    root.group("runs").attrs["stage_timings"] = stage_timings
