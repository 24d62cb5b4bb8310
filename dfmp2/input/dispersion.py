"""Empirical dispersion of a double hybrid, from the field's own libraries: s-dftd3 (``dftd3``:
D3 with Becke-Johnson or zero damping) and ``dftd4`` (D4), each with the damping parameters it
tabulates for the functional. Nothing here evaluates a dispersion formula; the libraries do,
so a number is the one every other program using them gets.

Both are optional (``pip install 'dfmp2[dispersion]'``) and imported only when a dispersion
term is asked for.
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass
from types import ModuleType

import numpy as np
from pyscf import gto
from pyscf.data import elements

from dfmp2.errors import InputError

NONE = "none"
MODELS = ("d3bj", "d3zero", "d4")
CHOICES = (*MODELS, NONE)
EXTRA = "pip install 'dfmp2[dispersion]'"
# How the models are written after a functional's name (ORCA's keywords), and the library of
# each.
LABELS = {"d3bj": "D3BJ", "d3zero": "D3ZERO", "d4": "D4"}
PACKAGES = {"d3bj": "dftd3", "d3zero": "dftd3", "d4": "dftd4"}
# A heavy atom and a hydrogen this far apart (Bohr) lie inside every damping function's
# asymptotic range, so their energy is nonzero whenever the library has C6 for the element.
_PROBE_DISTANCE = 6.0


@dataclass(frozen=True)
class Dispersion:
    """A dispersion model and the library's name of the functional whose parameters it uses."""

    model: str
    method: str

    @property
    def label(self) -> str:
        return LABELS[self.model]

    @property
    def package(self) -> str:
        return PACKAGES[self.model]

    def describe(self) -> str:
        """e.g. ``D3BJ (dftd3 1.7.0, parameters of b2plyp)``, as the record keeps it."""
        return (f"{self.label} ({self.package} {_module(self.model, '').__version__}, "
                f"parameters of {self.method})")


def _module(model: str, submodule: str = ".interface") -> ModuleType:
    """The library of ``model``, imported now (not with dfmp2) because it is optional."""
    try:
        return importlib.import_module(PACKAGES[model] + submodule)
    except ImportError:
        raise InputError(f"dispersion {LABELS[model]} needs the {PACKAGES[model]} package, "
                         f"which is not installed: {EXTRA}") from None


def damping(dispersion: Dispersion):
    """The library's damping parameters for the functional, as tabulated there: D3 two-body
    (the published D3 fits have no three-body term), D4 with its default three-body term."""
    interface = _module(dispersion.model)
    kinds = {"d3bj": "RationalDampingParam", "d3zero": "ZeroDampingParam", "d4": "DampingParam"}
    try:
        return getattr(interface, kinds[dispersion.model])(method=dispersion.method)
    except RuntimeError as exc:
        raise InputError(f"{dispersion.package} has no {dispersion.label} parameters for "
                         f"'{dispersion.method}' ({exc}); choose another --dispersion") from None


def real_atoms(mol: gto.Mole, ghosts: frozenset[int]) -> tuple[np.ndarray, np.ndarray]:
    """Atomic numbers and positions (Bohr) of the atoms that are there: ghost atoms carry basis
    functions only, so they have no dispersion."""
    real = [n for n in range(mol.natm) if n not in ghosts]
    numbers = np.array([elements.charge(mol.atom_pure_symbol(n)) for n in real], dtype=int)
    return numbers, np.asarray(mol.atom_coords()[real], dtype=float).reshape(-1, 3)


def dispersion_energy(dispersion: Dispersion, mol: gto.Mole,
                      ghosts: frozenset[int] = frozenset()) -> float:
    """The dispersion energy (Eh) of the molecule's real atoms; D4 also takes its charge."""
    param = damping(dispersion)
    numbers, positions = real_atoms(mol, ghosts)
    for number in sorted(set(numbers.tolist())):
        _check_element(dispersion, param, number)
    try:
        energy = _energy(dispersion, param, numbers, positions, float(mol.charge))
    except RuntimeError as exc:
        raise InputError(f"{dispersion.package} cannot treat this molecule ({exc}); drop the "
                         "dispersion term") from None
    return energy


def dispersion_gradient(dispersion: Dispersion, mol: gto.Mole,
                        ghosts: frozenset[int] = frozenset()) -> np.ndarray:
    """The library's analytic gradient of the dispersion energy (natm, 3), Eh/Bohr; ghost
    atoms' rows are zero. The elements were checked when the energy was computed."""
    numbers, positions = real_atoms(mol, ghosts)
    try:
        result = _evaluate(dispersion, damping(dispersion), numbers, positions,
                           float(mol.charge), grad=True)
    except RuntimeError as exc:
        raise InputError(f"{dispersion.package} cannot treat this molecule ({exc}); drop the "
                         "dispersion term") from None
    gradient = np.zeros((mol.natm, 3))
    gradient[[n for n in range(mol.natm) if n not in ghosts]] = result["gradient"]
    return gradient


def _evaluate(dispersion: Dispersion, param, numbers: np.ndarray, positions: np.ndarray,
              charge: float, grad: bool) -> dict:
    interface = _module(dispersion.model)
    if dispersion.model == "d4":
        model = interface.DispersionModel(numbers, positions, charge=charge)
    else:
        model = interface.DispersionModel(numbers, positions)
    return model.get_dispersion(param, grad=grad)


def _energy(dispersion: Dispersion, param, numbers: np.ndarray, positions: np.ndarray,
            charge: float) -> float:
    return float(_evaluate(dispersion, param, numbers, positions, charge, False)["energy"])


def _check_element(dispersion: Dispersion, param, number: int) -> None:
    """Refuse an element outside the library's reference set. s-dftd3 (and dftd4 before 3.7)
    give such an element a zero C6 instead of an error, so it is tried against hydrogen."""
    try:
        energy = _energy(dispersion, param, np.array([number, 1]),
                         np.array([[0.0, 0.0, 0.0], [0.0, 0.0, _PROBE_DISTANCE]]), 0.0)
    except RuntimeError:
        energy = 0.0
    if energy == 0.0:
        raise InputError(f"{dispersion.package} has no {dispersion.label} parameters for "
                         f"{elements.ELEMENTS[number]} (Z = {number}); drop the dispersion term")
