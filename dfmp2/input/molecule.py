"""The PySCF molecule of a geometry: charge and spin, basis set and effective core potentials."""
from __future__ import annotations

import functools
import logging
import os
import re
import warnings
from pathlib import Path

from pyscf import gto
from pyscf.data import elements

from dfmp2.errors import InputError
from dfmp2.input.basis_files import (BASIS_ERRORS, as_pyscf_reads, basis_error_text,
                                     is_library_name, library_files, refuse_misread_basis,
                                     refuse_pseudopotential_basis, refuse_shadowed_library_name,
                                     source_basis)
from dfmp2.input.xyz import Geometry
from dfmp2.system.files import FILE, existing_kind

log = logging.getLogger(__name__)
NO_ECP = "none"
# Dashes that text pasted from a paper or a PDF holds where a basis name has a hyphen.
NOT_HYPHENS = frozenset("\u2010\u2011\u2012\u2013\u2014\u2015\u2212")


def resolve_charge_spin(geometry: Geometry, charge: int | None, spin: int | None,
                        ghosts: frozenset[int] = frozenset(),
                        ecp_electrons: int = 0) -> tuple[int, int]:
    """Charge and spin (2S, PySCF's convention): flags win over the comment line. Ghost atoms
    bring no nuclear charge; electrons replaced by core potentials are not counted."""
    geometry.refuse_unread(charge is not None, spin is not None)
    if charge is None:
        charge = geometry.charge if geometry.charge is not None else 0
    if spin is None and geometry.multiplicity is not None:
        spin = geometry.multiplicity - 1
    nuclear = sum(elements.charge(symbol) for n, symbol in enumerate(geometry.symbols)
                  if n not in ghosts) - ecp_electrons
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


def element_ecp(name: str, symbol: str) -> list | None:
    """The effective core potential ``name`` defines for ``symbol``, or None: from PySCF's
    bundled library, where a basis such as def2-SVP, LANL2DZ or cc-pVDZ-PP keeps its core
    potentials next to its orbital functions, or from the NWChem-format file ``name`` (a
    basis file from the Basis Set Exchange carries them the same way; ignored, iodine ran
    all-electron in a basis made for 25 of its electrons)."""
    files = gto.basis.ALIAS.get(gto.basis._format_basis_name(name))
    if files is None:
        if not os.path.isfile(name):
            return None
        paths = [name]
    else:
        paths = [os.path.join(gto.basis._BASIS_DIR, file)
                 for file in ((files,) if isinstance(files, str) else files)]
    for path in paths:
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                data = gto.basis.load_ecp(path, symbol)
        except Exception:  # PySCF raises several types for "no ECP for this element"
            continue
        if data:
            return data
    return None


def _starts_with_ecp_line(path: str) -> bool:
    """Whether the file ``path`` has ``ECP`` as its first line: PySCF finds NWChem's ECP
    blocks only after a line break, so such a file read as holding no potential at all."""
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            first = handle.readline()
    except OSError:
        return False
    return first.strip().upper() == "ECP"


def companion_ecp(basis: str) -> str | None:
    """The library's core potentials that a library basis is made for but does not carry:
    PySCF keeps the ccECP and BFD potentials in entries of their own (``ccecp``,
    ``bfd-pp``) beside the valence bases built for them (ccECP-cc-pVDZ in the same folder,
    BFD-VDZ under the same file-name stem), where def2-SVP carries its own. None for a
    basis that carries potentials, one with no such neighbour, or when more than one set of
    files would fit."""
    return _companion_ecp(gto.basis._format_basis_name(basis))


@functools.cache
def _companion_ecp(formatted: str) -> str | None:
    files = gto.basis.ALIAS.get(formatted)
    if files is None or _carries_potentials(formatted):
        return None
    family = {_file_family(path) for path in library_files(files)}
    fitting: dict[tuple[str, ...], list[str]] = {}
    for key, value in gto.basis.ALIAS.items():
        if key != formatted and {_file_family(path) for path in library_files(value)} & family:
            fitting.setdefault(library_files(value), []).append(key)
    found = [max(keys, key=len) for keys in fitting.values() if _carries_potentials(keys[0])]
    return found[0] if len(found) == 1 else None


def _file_family(path: str) -> tuple[str, str]:
    """A library file's folder and the start of its name: ccECP_cc-pVDZ.dat and ccECP.dat
    share ('ccecp-basis/ccECP', 'ccECP'), bfd_vdz.dat and bfd_pp.dat ('', 'bfd')."""
    folder, name = os.path.split(path)
    return folder, name.split(".")[0].split("_")[0]


def _carries_potentials(key: str) -> bool:
    """Whether a library entry's files hold an ECP section (NWChem's ``ECP`` line)."""
    for file in library_files(gto.basis.ALIAS.get(key, ())):
        try:
            with open(os.path.join(gto.basis._BASIS_DIR, file), encoding="utf-8",
                      errors="replace") as handle:
                if any(line.strip().upper() == "ECP" for line in handle):
                    return True
        except OSError:
            continue
    return False


def _potential_made_for(basis: str, symbol: str) -> list | None:
    """The core potential ``basis`` carries for ``symbol`` or is made for, or None."""
    companion = companion_ecp(basis)
    return element_ecp(basis, symbol) or (element_ecp(companion, symbol)
                                          if companion is not None else None)


def resolve_ecp(basis: str, ecp: str | None, symbols: tuple[str, ...]) -> dict[str, str]:
    """Element -> ECP name. By default a basis brings its own core potentials (def2-* from Rb
    on, LANL2DZ, cc-pVnZ-PP ...), as PySCF does with ``ecp=basis``, or the library's set it
    is made for (:func:`companion_ecp`: ccECP-cc-pVDZ ran all-electron, water 18 Eh below
    the valence calculation meant, with status 0); ``none`` runs all-electron; any other
    name is an ECP set that must cover at least one element of the molecule. A basis PySCF
    uncontracts or contracts anew is made for the potentials of the basis it reshapes (xenon
    in unc-def2-svp ran all-electron on valence functions, E(SCF) 6727 Eh too high, status
    0)."""
    basis = source_basis(basis)
    present = sorted(set(symbols), key=elements.charge)
    if ecp is not None and ecp.strip().lower() == NO_ECP:
        carried = [s for s in present if _potential_made_for(basis, s)]
        if carried:
            log.warning("--ecp none: %s run all-electron in %s, a basis made for core "
                        "potentials there", ", ".join(carried), basis)
        return {}
    name = basis if ecp is None else ecp.strip()
    if not name:
        raise InputError("--ecp needs a name, e.g. def2-svp, or 'none'")
    if ecp is not None:
        # The library's potentials would be used and the file's digest recorded.
        refuse_shadowed_library_name(name, "--ecp")
        kind = existing_kind(Path(name), follow_links=True)
        # PySCF reads a name as a file only when it is one: a folder named after a library
        # potential (runs kept in def2-svp/) leaves the name to the library.
        if kind not in (None, FILE) and not is_library_name(name):
            # Read for its first line, /dev/zero filled the memory and a FIFO waited forever.
            raise InputError(f"--ecp {name} is {kind}, not a regular file; give an ECP name "
                             "or a basis file")
    chosen = {symbol: name for symbol in present if element_ecp(name, symbol)}
    companion = companion_ecp(basis) if ecp is None else None
    if companion is not None:
        # A file of its name here would be hashed into the record as the potentials used.
        refuse_shadowed_library_name(companion, f"the core potentials of {basis}")
        chosen.update((symbol, companion) for symbol in present
                      if symbol not in chosen and element_ecp(companion, symbol))
    if ecp is not None and not chosen:
        if _starts_with_ecp_line(name):
            raise InputError(f"ECP file '{ecp}' starts with its ECP line, where PySCF's "
                             "NWChem reader does not look for it; put a comment line "
                             "('#') before it")
        if not is_library_name(name) and not os.path.isfile(name):
            raise InputError(f"unknown ECP '{ecp}': neither a PySCF library name nor a file; "
                             "give one such as def2-svp, lanl2dz or ccecp, or 'none'")
        raise InputError(f"ECP '{ecp}' has no core potential for any of "
                         f"{', '.join(present)}; choose another --ecp or 'none'")
    if ecp is not None and is_library_name(basis):
        _warn_of_other_potentials(basis, name, present, chosen)
    return chosen


def _warn_of_other_potentials(basis: str, name: str, present: list[str],
                              chosen: dict[str, str]) -> None:
    """Warn where ``--ecp name`` gives elements other core potentials than the library
    basis is made for: a potential on an all-electron basis, another potential than the
    basis's (HI in ccECP-cc-pVDZ with def2-SVP's: iodine's 28 core electrons where the
    basis is made for 46), or none where the basis is made for one."""
    made_for = {s: potential for s in present
                if (potential := _potential_made_for(basis, s)) is not None}
    plural = {True: "", False: "s"}
    all_electron = [s for s in chosen if s not in made_for]
    if all_electron:
        log.warning("--ecp %s: %s get%s a core potential, but %s has all-electron functions "
                    "there (their core functions stay, as low virtual orbitals); leave "
                    "--ecp out to keep the basis's own potentials, or choose a basis made "
                    "for %s", name, ", ".join(all_electron), plural[len(all_electron) > 1],
                    basis, name)
    other = [s for s in chosen if s in made_for and element_ecp(chosen[s], s) != made_for[s]]
    if other:
        log.warning("--ecp %s: %s get%s another core potential than the one %s is made for; "
                    "leave --ecp out to keep it", name, ", ".join(other),
                    plural[len(other) > 1], basis)
    bare = [s for s in made_for if s not in chosen]
    if bare:
        log.warning("--ecp %s: %s run%s all-electron in %s, a basis made for core potentials "
                    "there; leave --ecp out to keep them", name, ", ".join(bare),
                    plural[len(bare) > 1], basis)


def build_molecule(geometry: Geometry, basis: str, charge: int, spin: int,
                   ecp: dict[str, str] | None = None,
                   ghosts: frozenset[int] = frozenset()) -> gto.Mole:
    """The PySCF molecule; an unknown basis or one lacking an element is an InputError."""
    if not basis.strip():
        raise InputError("--basis is empty; give a PySCF basis name such as cc-pvdz")
    refuse_misread_basis(basis, "--basis", geometry.symbols)
    refuse_pseudopotential_basis(basis)
    mol = gto.Mole()
    mol.atom = geometry.pyscf_atoms(ghosts)
    mol.unit = "Angstrom"
    mol.basis = as_pyscf_reads(basis)
    mol.ecp = {symbol: element_ecp(name, symbol) for symbol, name in (ecp or {}).items()}
    mol.charge = charge
    mol.spin = spin
    mol.verbose = 0
    mol.output = None
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            mol.build(parse_arg=False, dump_input=False)
    except BASIS_ERRORS as exc:
        raise InputError(_basis_message(basis, exc, geometry.symbols)) from None
    return mol


def _basis_message(basis: str, exc: Exception, symbols: tuple[str, ...]) -> str:
    text = basis_error_text(exc)
    match = re.search(r"not found for (\w+)", text)
    if match:
        return (f"basis '{basis}' has no functions for {match.group(1)} in PySCF's library; "
                "choose a basis that covers it, or give one as a basis file (NWChem format, "
                "as the Basis Set Exchange writes it)")
    if ("Unknown basis" in text or "basis" in text.lower()
            or isinstance(exc, (OSError, KeyError))):
        dashes = sorted(set(basis) & NOT_HYPHENS)
        typed = (f" (it holds {', '.join(map(repr, dashes))}, not the plain hyphen '-')"
                 if dashes else "")
        return (f"unknown basis '{basis}'{typed}; use a PySCF basis name such as cc-pvdz or "
                "def2-svp")
    elements_present = ", ".join(sorted(set(symbols)))
    return f"cannot build the molecule ({elements_present}) with basis '{basis}': {text}"
