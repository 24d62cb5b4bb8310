"""XYZ input: parsing, validation with one-line errors, and the PySCF molecule."""
from __future__ import annotations

import math
import re
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from pyscf import gto
from pyscf.data import elements

from dfmp2.errors import InputError

MIN_DISTANCE_ANGSTROM = 0.1
MAX_COORDINATE_ANGSTROM = 1.0e4
KNOWN_SYMBOLS = {symbol.upper(): symbol for symbol in elements.ELEMENTS[1:]}
CHARGE_PATTERN = re.compile(r"\bcharge\s*=\s*([+-]?\d+)\b", re.IGNORECASE)
MULTIPLICITY_PATTERN = re.compile(r"\bmultiplicity\s*=\s*(\d+)\b", re.IGNORECASE)


@dataclass(frozen=True)
class Geometry:
    """A parsed XYZ file: symbols, coordinates in Angstrom, the comment's charge/multiplicity."""

    symbols: tuple[str, ...]
    coords: np.ndarray
    comment: str
    charge: int | None
    multiplicity: int | None
    text: str
    source: str

    @property
    def natoms(self) -> int:
        return len(self.symbols)

    def pyscf_atoms(self, ghosts: frozenset[int] = frozenset()
                    ) -> list[tuple[str, tuple[float, float, float]]]:
        """PySCF atoms; those in ``ghosts`` carry basis functions but no charge or electrons."""
        return [(f"ghost-{symbol}" if n in ghosts else symbol, tuple(xyz))
                for n, (symbol, xyz) in enumerate(zip(self.symbols, self.coords.tolist()))]


def read_xyz(path: str | Path) -> Geometry:
    path = Path(path)
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise InputError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise InputError(f"{path} is a directory, not an XYZ file") from None
    except OSError as exc:
        raise InputError(f"{path}: cannot read ({exc.strerror})") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise InputError(f"{path} is not a text XYZ file (it is not valid UTF-8)") from None
    return parse_xyz(text, source=str(path))


def _parse_symbol(token: str, where: str) -> str:
    if re.fullmatch(r"\d+", token):
        z = int(token)
        hint = f" ('{elements.ELEMENTS[z]}')" if 0 < z < len(elements.ELEMENTS) else ""
        raise InputError(f"{where}: '{token}' is an atomic number; write the element symbol{hint}")
    canonical = KNOWN_SYMBOLS.get(token.upper())
    if canonical is None:
        raise InputError(f"{where}: unknown element '{token}'")
    if token != canonical:
        raise InputError(f"{where}: element symbol '{token}' is not in standard case; "
                         f"write '{canonical}'")
    return canonical


def _parse_coordinate(token: str, where: str) -> float:
    try:
        value = float(token)
    except ValueError:
        raise InputError(f"{where}: coordinate '{token}' is not a number") from None
    if not math.isfinite(value):
        raise InputError(f"{where}: coordinate '{token}' is not finite")
    if abs(value) > MAX_COORDINATE_ANGSTROM:
        raise InputError(f"{where}: coordinate {token} Angstrom is beyond "
                         f"{MAX_COORDINATE_ANGSTROM:g} Angstrom; check the units")
    return value


def _comment_int(pattern: re.Pattern, comment: str) -> int | None:
    match = pattern.search(comment)
    return int(match.group(1)) if match else None


def parse_xyz(text: str, source: str = "<input>") -> Geometry:
    """Parse standard XYZ text (count, comment, ``Symbol x y z`` lines in Angstrom)."""
    if "\x00" in text:
        raise InputError(f"{source} is not a text XYZ file (it contains NUL bytes)")
    lines = text.splitlines()
    while lines and not lines[-1].strip():
        lines.pop()
    if not lines:
        raise InputError(f"{source} is empty; an XYZ file starts with the number of atoms")
    try:
        natoms = int(lines[0].strip())
    except ValueError:
        raise InputError(f"{source}, line 1: expected the number of atoms, "
                         f"found {lines[0].strip()[:40]!r}") from None
    if natoms < 1:
        raise InputError(f"{source}, line 1: the number of atoms must be at least 1")
    comment = lines[1] if len(lines) > 1 else ""
    atom_lines = lines[2:]
    if len(atom_lines) != natoms:
        raise InputError(f"{source}: line 1 announces {natoms} atoms but "
                         f"{len(atom_lines)} atom lines follow")
    symbols, coords = [], []
    for number, line in enumerate(atom_lines, start=3):
        where = f"{source}, line {number}"
        fields = line.split()
        if len(fields) != 4:
            raise InputError(f"{where}: expected 'Symbol x y z', found {line.strip()[:60]!r}")
        symbols.append(_parse_symbol(fields[0], where))
        coords.append([_parse_coordinate(token, where) for token in fields[1:]])
    coords_array = np.asarray(coords, dtype=float)
    _check_distances(symbols, coords_array, source)
    return Geometry(tuple(symbols), coords_array, comment.strip(),
                    _comment_int(CHARGE_PATTERN, comment),
                    _comment_int(MULTIPLICITY_PATTERN, comment), text, source)


def _check_distances(symbols: list[str], coords: np.ndarray, source: str) -> None:
    if len(symbols) < 2:
        return
    diff = coords[:, None, :] - coords[None, :, :]
    dist = np.sqrt(np.einsum("ijk,ijk->ij", diff, diff))
    np.fill_diagonal(dist, np.inf)
    i, j = np.unravel_index(np.argmin(dist), dist.shape)
    if dist[i, j] < MIN_DISTANCE_ANGSTROM:
        a, b = sorted((int(i), int(j)))
        raise InputError(f"{source}: atoms {a + 1} ({symbols[a]}) and {b + 1} ({symbols[b]}) are "
                         f"{dist[i, j]:.3f} Angstrom apart (minimum {MIN_DISTANCE_ANGSTROM})")


def resolve_charge_spin(geometry: Geometry, charge: int | None, spin: int | None,
                        ghosts: frozenset[int] = frozenset()) -> tuple[int, int]:
    """Charge and spin (2S, PySCF's convention): flags win over the comment line. Ghost atoms
    bring no nuclear charge."""
    if charge is None:
        charge = geometry.charge if geometry.charge is not None else 0
    if spin is None:
        multiplicity = geometry.multiplicity
        if multiplicity is not None and multiplicity < 1:
            raise InputError(f"{geometry.source}: multiplicity must be at least 1")
        spin = multiplicity - 1 if multiplicity is not None else None
    nuclear = sum(elements.charge(symbol) for n, symbol in enumerate(geometry.symbols)
                  if n not in ghosts)
    nelectron = nuclear - charge
    if nelectron < 1:
        raise InputError(f"charge {charge:+d} leaves {nelectron} electrons "
                         f"(nuclear charge {nuclear}); lower the charge")
    if nelectron % 2 and not spin:
        raise InputError(f"{nelectron} electrons (charge {charge:+d}) cannot be closed-shell; "
                         "open-shell references need --spin (2S, e.g. --spin 1 for a doublet)")
    spin = spin or 0
    if spin < 0:
        raise InputError(f"--spin must be non-negative (it is 2S = N_alpha - N_beta), got {spin}")
    if (nelectron - spin) % 2:
        raise InputError(f"{nelectron} electrons cannot have spin 2S={spin}: the parity differs; "
                         "--spin is 2S (multiplicity - 1)")
    if spin > nelectron:
        raise InputError(f"spin 2S={spin} exceeds the {nelectron} electrons")
    return charge, spin


def build_molecule(geometry: Geometry, basis: str, charge: int, spin: int,
                   ghosts: frozenset[int] = frozenset()) -> gto.Mole:
    """The PySCF molecule; an unknown basis or one lacking an element is an InputError."""
    mol = gto.Mole()
    mol.atom = geometry.pyscf_atoms(ghosts)
    mol.unit = "Angstrom"
    mol.basis = basis
    mol.charge = charge
    mol.spin = spin
    mol.verbose = 0
    mol.output = None
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            mol.build(parse_arg=False, dump_input=False)
    except (RuntimeError, KeyError, ValueError) as exc:
        raise InputError(_basis_message(basis, exc, geometry.symbols)) from None
    return mol


def _basis_message(basis: str, exc: Exception, symbols: tuple[str, ...]) -> str:
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    match = re.search(r"not found for (\w+)", text)
    if match:
        return (f"basis '{basis}' has no functions for {match.group(1)}; "
                "choose a basis that covers it")
    if "Unknown basis" in text or "basis" in text.lower():
        return f"unknown basis '{basis}'; use a PySCF basis name such as cc-pvdz or def2-svp"
    elements_present = ", ".join(sorted(set(symbols)))
    return f"cannot build the molecule ({elements_present}) with basis '{basis}': {text}"
