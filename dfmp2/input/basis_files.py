"""Basis sets given as files. PySCF reads a basis name as a file path when a file of that
name exists (before its library), so ``--basis``, ``--auxbasis`` and ``--jk-auxbasis`` may
name NWChem-format files. Such a basis is identified by its contents, not its name: an
edited file is another calculation, never resumed from or reused (a resume after an edit
mixed block pairs of two fitting bases, 1e-6 Eh off, with status 0). A file that has a
library basis's name is refused: PySCF would quietly read it in place of the library's.
"""
from __future__ import annotations

import hashlib
import os
import re

from pyscf import df, gto
from pyscf.data import elements
from pyscf.gto.basis import parse_cp2k, parse_nwchem
from pyscf.lib.exceptions import BasisNotFoundError

from dfmp2.errors import InputError


# What PySCF raises for a basis it cannot build: an unknown name or element (RuntimeError,
# KeyError), a malformed one (ValueError, TypeError), or a Pople name whose polarisation
# file its library lacks (FileNotFoundError: 6-31G(d'), 3-21G(d)), or a contraction it
# cannot take from the basis (AssertionError: cc-pvdz@3s2p, three s functions of hydrogen's
# two).
BASIS_ERRORS = (RuntimeError, KeyError, ValueError, TypeError, OSError, AssertionError)
# PySCF's basis reader uncontracts the basis named after this prefix, and contracts anew
# the one named before this mark by the scheme after it.
UNCONTRACTED = "unc"
CONTRACTION_SCHEME = "@"


def basis_error_text(exc: Exception) -> str:
    """The first line of what PySCF raised, without the library's file paths."""
    if isinstance(exc, OSError):
        return "PySCF's library has no file for it"
    text = str(exc).strip()
    return text.splitlines()[0].strip() if text else type(exc).__name__


def file_digest(name: str) -> str:
    """``sha256:<hex>`` of the file a basis name reads, or empty for a library name."""
    if not os.path.isfile(name):
        return ""
    return "sha256:" + hashlib.sha256(_file_bytes(name)).hexdigest()


def _file_bytes(name: str) -> bytes:
    try:
        with open(name, "rb") as handle:
            return handle.read()
    except OSError as exc:
        raise InputError(f"cannot read the basis file {name!r} ({exc.strerror})") from None


def refuse_misread_basis(name: str, option: str, symbols) -> None:
    """Refuse a basis name that PySCF would read as another basis than the one asked for,
    without a word: a file in place of the library basis of its name, part of a Pople name,
    or, from a file, another element's functions for ``symbols`` it lacks."""
    refuse_shadowed_library_name(name, option)
    _refuse_partial_pople(name, option)
    _refuse_missing_elements(name, symbols, option)


def as_pyscf_reads(name: str) -> str:
    """``name`` in the form PySCF's basis reader reads as meant: a file that exists by a path
    that does not begin with 'unc', which the reader strips as 'uncontract what follows'
    (--basis uncle.nw was read as le.nw and refused as unknown)."""
    if os.path.isfile(name) and name.lower().startswith(UNCONTRACTED):
        return os.path.join(os.curdir, name)
    return name


def source_basis(basis: str) -> str:
    """The basis whose functions PySCF's basis reader reshapes, as that reader reads the
    name: 'unc' before it uncontracts them (unc-def2-svp), '@' and a scheme after it
    contracts them anew (def2-svp@5s4p2d); a file is itself (:func:`as_pyscf_reads`)."""
    if os.path.isfile(basis):
        return basis
    if basis.lower().startswith(UNCONTRACTED):
        basis = basis[len(UNCONTRACTED):].lstrip("-_ ")
    return basis.split(CONTRACTION_SCHEME)[0]


def refuse_pseudopotential_basis(name: str) -> None:
    """Refuse a valence basis made for GTH pseudopotentials (gth-dzvp, also uncontracted):
    PySCF's molecular code builds it without them, so water ran all-electron on valence
    functions alone (E(SCF) -34.5 Eh, status 0; -62.1 Eh in unc-gth-dzvp)."""
    source = source_basis(name)
    if (not os.path.isfile(name)
            and gto.basis._format_basis_name(source) in getattr(gto.basis, "GTH_ALIAS", {})):
        raise InputError(f"--basis {name!r} is a valence basis for GTH pseudopotentials, which "
                         "dfmp2 does not apply; choose an all-electron basis, or one with core "
                         "potentials PySCF's molecular code reads (def2-svp, ccecp-cc-pvdz, "
                         "lanl2dz)")


def _refuse_missing_elements(name: str, symbols, option: str) -> None:
    """Refuse a basis file that holds no functions for one of ``symbols``: PySCF's reader
    then hands that element the file's other functions (water in a file of hydrogen's alone
    ran its oxygen on hydrogen's s shell, E(SCF) -48 Eh, status 0). An element's shells
    start with a line of its symbol and a word: ``O  S`` in NWChem's format, ``O  DZVP-GTH``
    in CP2K's, the two PySCF reads; core-potential sections' lines look alike and do not
    count."""
    if not os.path.isfile(name):
        return
    shells = _shell_lines(_basis_part(_file_bytes(name).decode("utf-8", errors="replace"))
                          .splitlines())
    missing = [symbol for symbol in dict.fromkeys(symbols) if symbol not in shells]
    if missing:
        raise InputError(f"{option} file {name!r} has no functions for {', '.join(missing)}; "
                         "add them to it, or choose a basis that covers every element")
    _refuse_misread_blocks(name, shells, symbols, option)


def _refuse_misread_blocks(name: str, shells: list[str], symbols, option: str) -> None:
    """Refuse a basis file whose element blocks PySCF's reader does not find as they are
    meant (NWChem's format, where a block follows a '#BASIS SET' or END line):

    - an element whose block it cannot find gets the whole file (a file without '#BASIS SET'
      lines gave water's H and O every shell: nao 18 for STO-3G's 7, E(SCF) 0.05 Eh low,
      status 0);
    - of an element with several different blocks in one basis section it reads the first
      alone (NWChem adds them up; O's SP shell after a '#BASIS SET' line of its own was left
      out). An identical copy, as some library files hold, and the blocks of another
      section (NWChem's "cd basis" after the "ao basis") are not read by either, rightly;
    - an element's block that goes on with another element's shells gives it those too.

    ``shells``: the element of each shell line of the file's basis part."""
    elements_asked = list(dict.fromkeys(symbols))
    try:
        blocks = _element_blocks(name)
        # PySCF's own search decides what it finds: a shell line 'h  S' is not hydrogen's.
        found = {symbol: bool(parse_nwchem.search_seg(name, symbol))
                 for symbol in elements_asked}
    except (UnicodeDecodeError, OSError):
        # PySCF's readers fail alike when they build the molecule, which says so.
        return
    unfound, split, mixed = [], [], []
    for symbol in elements_asked:
        own = [(section, lines) for section, element, lines in blocks
               if element == symbol and lines[0].split()[0] == symbol]
        if not (found[symbol] and own):
            if set(shells) - {symbol} and not _cp2k_block_found(name, symbol):
                unfound.append(symbol)
            continue
        first_section, first = own[0]
        if set(_shell_lines(first)) - {symbol}:
            mixed.append(symbol)
        elif any(section == first_section and _parsed(lines) != _parsed(first)
                 for section, lines in own[1:]):
            split.append(symbol)
    if unfound:
        raise InputError(f"{option} file {name!r}: PySCF finds no block of its own for "
                         f"{', '.join(unfound)} and would give each all of the file's shells, "
                         "other elements' too (an element's block starts the file or follows a "
                         "'#BASIS SET' or END line, and its first line starts with the symbol "
                         "spelt O or Cl); put a line '#BASIS SET' before each element's first "
                         "shell, as basis-set-exchange writes them")
    if mixed:
        raise InputError(f"{option} file {name!r}: the block of {', '.join(mixed)} goes on "
                         "with another element's shells, which PySCF would add to it; put a "
                         "line '#BASIS SET' before each element's first shell")
    if split:
        raise InputError(f"{option} file {name!r} has shells of {', '.join(split)} in more "
                         "than one block (a '#BASIS SET' line between them), and PySCF reads "
                         "an element's first block alone; put each element's shells in one "
                         "block")


def _element_blocks(name: str) -> list[tuple[int, str, list[str]]]:
    """The blocks PySCF's NWChem reader splits a file into, each as (its basis section, the
    element of its first line, its lines from that one), for those that start with a shell
    line; a section ends at an END line."""
    with open(name, encoding="utf-8") as handle:
        text = handle.read()
    blocks, section, start = [], 0, 0
    for delimiter in [*parse_nwchem.BASIS_SET_DELIMITER.finditer(text), None]:
        lines = text[start:None if delimiter is None else delimiter.start()].splitlines()
        body = [line for line in lines if line.strip() and not line.lstrip().startswith("#")]
        found = _shell_lines(body[:1])
        if found:
            blocks.append((section, found[0], lines[lines.index(body[0]):]))
        if delimiter is not None:
            section += delimiter.group().startswith("END")
            start = delimiter.end()
    return blocks


def _parsed(lines: list[str]) -> list:
    """A block's shells as PySCF reads them."""
    try:
        return parse_nwchem._parse([line for line in lines if line and "END" not in line],
                                   optimize=False)
    except (ValueError, IndexError, KeyError):
        # Not PySCF's to read: compared as text.
        return lines


# The first line of a shell: an element's symbol and a word (``O  S``, CP2K's ``O  DZVP-GTH``).
SHELL_LINE = re.compile(r"[ \t]*([A-Za-z]{1,2})[ \t]+[A-Za-z]")
# Sections of an NWChem file that are no basis: core potentials and spin-orbit potentials,
# whose lines (``I nelec 28``, ``I S``) look like shells.
POTENTIAL_SECTION = re.compile(r"^[ \t]*(ECP|SO)\b.*?^[ \t]*END\b", re.MULTILINE | re.DOTALL
                               | re.IGNORECASE)


def _basis_part(text: str) -> str:
    return POTENTIAL_SECTION.sub("", text)


def _shell_lines(lines) -> list[str]:
    """The element of each line that starts a shell, in order."""
    found = []
    for line in lines:
        match = SHELL_LINE.match(line)
        if match and match.group(1).capitalize() in elements.ELEMENTS[1:]:
            found.append(match.group(1).capitalize())
    return found


def _cp2k_block_found(name: str, symbol: str) -> bool:
    try:
        return bool(parse_cp2k.search_seg(name, symbol))
    except BasisNotFoundError:
        return False


def refuse_shadowed_library_name(name: str, option: str) -> None:
    """Refuse a basis name that is both a PySCF library basis and a file here."""
    if os.path.isfile(name) and is_library_name(name):
        raise InputError(f"{option} {name!r} is a PySCF library basis, and a file of that name "
                         "is in this folder, which PySCF would read instead; give the file "
                         f"as ./{name} to use it, or rename it for the library basis")


def is_library_name(name: str) -> bool:
    """Whether PySCF's library has a basis of this name, or composes one from its files
    (a polarised Pople name such as 6-31G(d,p))."""
    formatted = gto.basis._format_basis_name(name)
    return formatted in gto.basis.ALIAS or _composed_pople(formatted)


def _composed_pople(formatted: str) -> bool:
    """Whether PySCF composes this polarised Pople name from files its library has: it has
    none for 3-21G(d) (so a file of that name was refused as shadowing a library basis)."""
    return _pople_files(formatted) is not None and not _missing_polarisation(formatted)


def _pople_files(formatted: str) -> set[str] | None:
    """The library files PySCF reads for a polarised Pople name, for heavy atoms and for
    hydrogen, or None for a name not of that shape."""
    composed = POLARISED_POPLE.fullmatch(formatted)
    if (composed is None or composed["base"] not in gto.basis.ALIAS
            or not gto.basis._is_pople_basis(formatted)):
        return None
    return {file for symbol in ("O", "H")
            for file in library_files(gto.basis._parse_pople_basis(formatted, symbol))}


def _missing_polarisation(formatted: str) -> list[str]:
    """The polarisation files of a polarised Pople name that PySCF's library lacks."""
    return sorted(file for file in _pople_files(formatted) or ()
                  if not os.path.isfile(os.path.join(gto.basis._BASIS_DIR, file)))


def _polarisation_groups(folder: str, base: str) -> list[str]:
    """The polarisation groups PySCF's library has files for in a Pople family (d, 2d, p ...
    of 6-31G), in the spelling of :data:`POLARISATION_FILE`."""
    found = (POLARISATION_FILE.fullmatch(f"{folder}/{file}")
             for file in os.listdir(os.path.join(gto.basis._BASIS_DIR, folder)))
    groups = [each["group"] for each in found if each is not None and each["base"] == base]
    return sorted(groups, key=lambda group: ("spdfgh".find(group[-1]), len(group), group))


def library_files(value: str | tuple) -> tuple[str, ...]:
    """The files of an entry of PySCF's alias table (a name, or a tuple of names)."""
    return (value,) if isinstance(value, str) else tuple(value)


def _refuse_partial_pople(name: str, option: str) -> None:
    """Refuse a Pople name that PySCF would not read as written: it takes one group of
    polarisation functions for heavy atoms and one for hydrogen and drops the rest without a
    word (6-31G(d)(p) ran as 6-31G(d), 6-31G(d,p,f) as 6-31G(d,p)), read 6-31G*(d) as the d
    shell twice, and has no files for primed groups (6-31G(d')) or for groups its family
    lacks (3-21G(d))."""
    formatted = gto.basis._format_basis_name(name)
    family = POPLE_BASE.match(formatted)
    if ("(" not in formatted or os.path.isfile(name) or formatted in gto.basis.ALIAS
            or family is None or family[0] not in gto.basis.ALIAS
            or _composed_pople(formatted)):
        return
    missing = [POLARISATION_FILE.fullmatch(file) for file in _missing_polarisation(formatted)]
    if missing and all(missing):
        folder, base = missing[0]["folder"], missing[0]["base"]
        asked = ", ".join(dict.fromkeys(found["group"] for found in missing))
        has = ", ".join(_polarisation_groups(folder, base)) or "none at all"
        raise InputError(f"{option} {name!r} asks for {asked} polarisation functions, which "
                         f"PySCF's library does not have for {base} (it has {has}); choose "
                         "a polarised basis it has, such as 6-31G(d,p)")
    raise InputError(f"{option} {name!r} is not a Pople name that PySCF reads as written; "
                     "give one group of polarisation functions for heavy atoms and one for "
                     "hydrogen, as in 6-31G(d,p) or 6-311+G(2df,2pd)")


def library_name_key(name: str) -> str:
    """A library basis name by what PySCF loads for it, so that two names of one basis
    compare equal and two bases never do: a name of PySCF's alias table by the file it reads
    (``ano`` and ``ano-rcc`` both read ano.dat; STO-3G, sto-3g and sto3g are one) and the
    fitting bases PySCF pairs with that name (6-31g** and 6-31gss read one file, but only
    6-31g** has an RI partner, so they stay two); a polarised Pople name that PySCF composes
    from its parts (6-31G(d,p)) by the name as PySCF reads it (case, hyphens, underscores and
    spaces do not matter); any other text as given."""
    formatted = gto.basis._format_basis_name(name)
    files = gto.basis.ALIAS.get(formatted)
    if files is not None:
        return f"PySCF library {files!r}, fitting partners {_fitting_partners(formatted)!r}"
    if _composed_pople(formatted):
        return formatted
    return name


# PySCF's own spelling (lower case, no hyphens) of a Pople basis it composes from the base's
# file and polarisation files: heavy atoms' functions, then hydrogen's after a comma.
POLARISED_POPLE = re.compile(r"(?P<base>[0-9]+\+*g)\([0-9a-z]+(,[0-9a-z]+)?\)")
# A polarisation file PySCF composes a Pople name from: pople-basis/6-31G-polarization-2d.dat.
POLARISATION_FILE = re.compile(r"(?P<folder>.+)/(?P<base>[^/]+)-polarization-(?P<group>[^/]+)\.dat")
# The family at the start of a Pople name in PySCF's spelling: 6311+g of 6311+g(2df,2pd).
POPLE_BASE = re.compile(r"[0-9]+\+*g")
# Where PySCF would log the partners it finds: never, so that nothing reaches stdout.
_SILENT = gto.Mole(verbose=0)


def _fitting_partners(formatted: str) -> tuple:
    """The RI and JK-fit bases PySCF's make_auxbasis (the default fitting bases) looks up by
    an orbital basis's name, a Pople name also by its family (6-31g for 6-31g**)."""
    predefined = getattr(df.addons, "predefined_auxbasis", None)
    if predefined is None:
        # An older PySCF looks its partners up by the whole name: the name keeps them apart.
        return (formatted,)
    names = [formatted]
    family = POPLE_BASE.match(formatted) if gto.basis._is_pople_basis(formatted) else None
    if family is not None:
        names.append(family[0])
    return tuple(predefined(_SILENT, each, "HF", mp2fit) for each in names
                 for mp2fit in (True, False))


def same_basis_name(name: str) -> tuple[str, str]:
    """The key two requests' ``--basis``-like names are compared by: a file by its name as
    given (another file is another basis; a record keeps its contents' digest), anything
    else by :func:`library_name_key`, each marked as which, so that no file's name can pass
    for a library basis."""
    return ("file", name) if os.path.isfile(name) else ("name", library_name_key(name))
