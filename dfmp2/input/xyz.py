"""XYZ input: parsing and validation with one-line errors.

Standard XYZ: the atom count, a comment line, then ``Symbol x y z`` lines. The comment line may
carry ``charge=N``, ``multiplicity=M`` and ``units=angstrom|bohr`` (``unit=`` too); any other
words in it are ignored, but a value given to one of those three keys must be valid, and a
``spin=`` or ``mult=`` without ``multiplicity=`` is refused rather than ignored.
"""
from __future__ import annotations

import math
import os
import re
import stat
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from pyscf.data import elements
from scipy.spatial import cKDTree

from dfmp2.errors import InputError
from dfmp2.input.comment import Unread, free_text, parse_comment

MIN_DISTANCE_ANGSTROM = 0.1
MAX_COORDINATE_ANGSTROM = 1.0e4
KNOWN_SYMBOLS = {symbol.upper(): symbol for symbol in elements.ELEMENTS[1:]}
UTF8_BOM = b"\xef\xbb\xbf"
# About 250,000 atoms at 60 bytes a line: far beyond what an MP2 run can hold, and a bound on
# what is read from a device or pipe given as the molecule (``/dev/zero`` never ends).
MAX_XYZ_BYTES = 16 * 2**20
LINE_END = re.compile(r"\r\n|\r|\n")
DECIMAL_NUMBER = re.compile(r"[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?", re.ASCII)


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
    unread: tuple[Unread, ...] = ()
    """The comment's charge or multiplicity in a form it does not read."""

    @property
    def natoms(self) -> int:
        return len(self.symbols)

    def refuse_unread(self, charge_given: bool, spin_given: bool,
                      charge_option: str = "--charge N", spin_option: str = "--spin 2S"
                      ) -> None:
        """Refuse a charge or multiplicity the comment line declares in a form it does not
        read, unless the command line gives that one (by the option named)."""
        unread = {item.field: item for item in reversed(self.unread)}
        for given, field, option in ((charge_given, "charge", charge_option),
                                     (spin_given, "multiplicity", spin_option)):
            if not given and field in unread:
                raise InputError(unread[field].refusal(option))

    def pyscf_atoms(self, ghosts: frozenset[int] = frozenset()
                    ) -> list[tuple[str, tuple[float, float, float]]]:
        """PySCF atoms in Angstrom; those in ``ghosts`` carry basis functions but no charge or
        electrons."""
        return [(f"ghost-{symbol}" if n in ghosts else symbol, tuple(xyz))
                for n, (symbol, xyz) in enumerate(zip(self.symbols, self.coords.tolist()))]

    def subset(self, atoms: range) -> "Geometry":
        """These atoms alone, as if read from their own XYZ file (in Angstrom, so the comment
        loses its charge, multiplicity and units)."""
        symbols = tuple(self.symbols[n] for n in atoms)
        coords = self.coords[list(atoms)]
        comment = free_text(self.comment)
        text = f"{len(symbols)}\n{comment}\n" + "".join(
            f"{s} {x:.10f} {y:.10f} {z:.10f}\n" for s, (x, y, z) in zip(symbols, coords))
        return Geometry(symbols, np.array(coords), comment, None, None, text, self.source)


def _named_pipe(path: Path) -> bool:
    """A FIFO other than this process's standard input (``/dev/stdin`` fed by a pipe works)."""
    try:
        status = os.stat(path)
    except (OSError, ValueError):
        return False
    if not stat.S_ISFIFO(status.st_mode):
        return False
    try:
        return not os.path.samestat(status, os.fstat(0))
    except OSError:
        return True


# The names of standard input: /dev/stdin, /dev/fd/0, /proc/self/fd/0, /proc/<pid>/fd/0.
STANDARD_INPUT_NAME = re.compile(r"^/(dev/stdin|dev/fd/0|proc/(self|[0-9]+)/fd/0)$")
# Links followed at most, as the kernel does.
MAX_LINK_HOPS = 40


def names_standard_input(path: Path) -> bool:
    """Whether ``path`` names this process's standard input, itself or through links to
    one of its names, rather than a file that is also redirected to it (a link to the list
    given with the list on standard input is that file)."""
    current = str(path)
    for _ in range(MAX_LINK_HOPS):
        if STANDARD_INPUT_NAME.search(current):
            return True
        try:
            target = os.readlink(current)
        except (OSError, ValueError):
            return False
        current = os.path.join(os.path.dirname(current), target)
    return False


def read_xyz(path: str | Path) -> Geometry:
    path = Path(path)
    if _named_pipe(path):
        raise InputError(f"{path} is a named pipe (FIFO), not an XYZ file: reading it would "
                         "wait for a writer; give the file itself (or pipe it to /dev/stdin)")
    try:
        with open(path, "rb") as handle:
            raw = handle.read(MAX_XYZ_BYTES + 1)
    except FileNotFoundError:
        raise InputError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise InputError(f"{path} is a directory, not an XYZ file") from None
    except OSError as exc:
        raise InputError(f"{path}: cannot read ({exc.strerror})") from None
    if len(raw) > MAX_XYZ_BYTES:
        raise InputError(f"{path} is larger than {MAX_XYZ_BYTES // 2**20} MiB, far more than "
                         "the XYZ file of a molecule dfmp2 can compute; check the file name")
    return parse_xyz(decode_xyz(raw, str(path)), source=str(path))


def decode_xyz(raw: bytes, source: str) -> str:
    """UTF-8 text (a byte-order mark is dropped). Only the free-text comment line may hold
    other bytes: it is then read as Latin-1, as editors on older systems write it."""
    if raw.startswith(UTF8_BOM):
        raw = raw[len(UTF8_BOM):]
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        pass
    lines = raw.split(b"\n")
    try:
        decoded = [line.decode("utf-8") if n != 1 else _comment_text(line)
                   for n, line in enumerate(lines)]
    except UnicodeDecodeError:
        raise InputError(f"{source} is not a text XYZ file (it is not valid UTF-8)") from None
    return "\n".join(decoded)


def _comment_text(line: bytes) -> str:
    try:
        return line.decode("utf-8")
    except UnicodeDecodeError:
        return line.decode("latin-1")


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


def decimal_number(token: str) -> float:
    """``token`` read as a number written in ASCII decimal or exponent form, as every
    chemistry program reads one: Python's float() also takes '1_0' (10), digits of other
    scripts, 'nan' and 'inf'. Raises ValueError saying 'not a number' or 'not finite'."""
    if not DECIMAL_NUMBER.fullmatch(token.strip()):
        try:
            finite = math.isfinite(float(token))
        except ValueError:
            finite = True
        raise ValueError(f"{token!r} is {'not a number' if finite else 'not finite'}")
    return float(token)


def _parse_coordinate(token: str, where: str, angstrom_per_unit: float) -> float:
    try:
        value = decimal_number(token)
    except ValueError as exc:
        raise InputError(f"{where}: coordinate {exc}") from None
    angstrom = value * angstrom_per_unit
    if abs(angstrom) > MAX_COORDINATE_ANGSTROM:
        raise InputError(f"{where}: coordinate {token} is beyond "
                         f"{MAX_COORDINATE_ANGSTROM:g} Angstrom; check the units")
    return angstrom


def text_lines(text: str) -> list[str]:
    """``text`` cut at line ends (\\n, \\r\\n, \\r) only. ``str.splitlines`` also cuts at form
    feeds, vertical tabs and Unicode's line separators (U+0085 is Windows-1252's ellipsis read
    as Latin-1), which turned the tail of a comment line into an atom."""
    lines = LINE_END.split(text)
    return lines[:-1] if lines and lines[-1] == "" else lines


def parse_xyz(text: str, source: str = "<input>") -> Geometry:
    """Parse XYZ text (count, comment, ``Symbol x y z`` lines); coordinates end in Angstrom."""
    if "\x00" in text:
        raise InputError(f"{source} is not a text XYZ file (it contains NUL bytes)")
    text = text.removeprefix("\ufeff")
    lines = text_lines(text)
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
    fields = parse_comment(comment, source)
    atom_lines = lines[2:]
    if len(atom_lines) != natoms:
        raise InputError(f"{source}: line 1 announces {natoms} atoms but "
                         f"{len(atom_lines)} atom lines follow")
    symbols, coords = [], []
    for number, line in enumerate(atom_lines, start=3):
        where = f"{source}, line {number}"
        tokens = line.split()
        if len(tokens) != 4:
            raise InputError(f"{where}: expected 'Symbol x y z', found {line.strip()[:60]!r}")
        symbols.append(_parse_symbol(tokens[0], where))
        coords.append([_parse_coordinate(token, where, fields.angstrom_per_unit)
                       for token in tokens[1:]])
    coords_array = np.asarray(coords, dtype=float)
    _check_distances(symbols, coords_array, source)
    return Geometry(tuple(symbols), coords_array, comment.strip(), fields.charge,
                    fields.multiplicity, text, source, fields.unread)


def geometry_from_atoms(symbols: list[str] | tuple[str, ...], coords: np.ndarray, units: str,
                        source: str) -> Geometry:
    """Atoms handed over by another program (a QCSchema molecule, ASE Atoms) as the XYZ text
    they amount to, through the same checks as a file; coordinates are written to full
    precision in their own ``units`` (angstrom or bohr)."""
    coords = np.asarray(coords, dtype=float).reshape(-1, 3)
    lines = [str(len(symbols)), f"units={units}"]
    lines += [f"{symbol} " + " ".join(format(float(value), ".17g") for value in row)
              for symbol, row in zip(symbols, coords)]
    return parse_xyz("\n".join(lines) + "\n", source=source)


def _check_distances(symbols: list[str], coords: np.ndarray, source: str) -> None:
    """The closest pair of atoms, found with a k-d tree: O(N log N) time and O(N) memory, so
    a file of many thousands of atoms is checked without an N x N distance matrix."""
    if len(symbols) < 2:
        return
    distances, neighbours = cKDTree(coords).query(coords, k=2)
    i = int(np.argmin(distances[:, 1]))
    # Two atoms at the same place are both at distance 0 from atom i, which may then be
    # listed as its own second neighbour.
    j = int(neighbours[i, 1] if neighbours[i, 1] != i else neighbours[i, 0])
    if distances[i, 1] < MIN_DISTANCE_ANGSTROM:
        a, b = sorted((i, j))
        raise InputError(f"{source}: atoms {a + 1} ({symbols[a]}) and {b + 1} ({symbols[b]}) are "
                         f"{distances[i, 1]:.3f} Angstrom apart (minimum {MIN_DISTANCE_ANGSTROM})")
