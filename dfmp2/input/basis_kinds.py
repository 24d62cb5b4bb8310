"""What a PySCF library basis is made for, read from the library's own file names: an
orbital basis or a fitting set of one kind (JK-fit for the SCF, MP2-fit for the correlation),
and whether its contraction is made for a scalar-relativistic Hamiltonian. dfmp2 runs any of
them where the user asks, as PySCF does, and warns where the choice gives other energies than
the user probably means. A basis file given by its path is the user's and is not classified.
"""
from __future__ import annotations

import os
import re
from collections.abc import Callable

from pyscf import gto

from dfmp2.input.basis_files import is_library_name, library_files

ORBITAL, JK_FIT, RI_FIT, J_FIT, F12_CABS = "orbital", "jk", "ri", "j", "cabs"
KIND_NAMES = {ORBITAL: "an orbital basis", JK_FIT: "a JK-fit set",
              RI_FIT: "an MP2-fit (RI) set", J_FIT: "a Coulomb-fit (J) set for DFT",
              F12_CABS: "an F12 complementary (OptRI) set"}
# The library's fitting files by name, the first match deciding: cc-pvdz-jkfit.dat,
# def2-universal-jkfit.dat; cc-pVDZ-F12-OptRI.dat; cc-pvdz-ri.dat, cc-pV5Z_MP2FIT.dat and
# cc-pvdz_fit.dat (Bernholdt and Harrison's RI-MP2 set); def2-universal-jfit.dat (weigend),
# ahlrichs_cfit.dat, DgaussA1_dft_xfit.dat. Any other library file holds an orbital basis.
FILE_KINDS = ((re.compile(r"jkfit", re.IGNORECASE), JK_FIT),
              (re.compile(r"optri", re.IGNORECASE), F12_CABS),
              (re.compile(r"(-ri|mp2fit|_fit)\.dat$", re.IGNORECASE), RI_FIT),
              (re.compile(r"[jcx]fit", re.IGNORECASE), J_FIT))
# PySCF's names of the Douglas-Kroll-Hess contractions (cc-pvdz-dk, cc-pvtz-dk3, dzp-dkh,
# sarc-dkh) and of ANO-RCC, whose file (ano.dat) its plain name ``ano`` reads too.
RELATIVISTIC_NAME = re.compile(r"dk|rcc")
# The suffix that marks the DKH contraction of a non-relativistic basis: cc-pVDZ-DK.
DK_SUFFIX = re.compile(r"[-_ ]?dk[h]?[0-9]*$", re.IGNORECASE)


def library_kind(name: str) -> str | None:
    """What the library basis ``name`` is made for (:data:`KIND_NAMES`), or None for a file,
    a name the library does not have, or one whose files are of several kinds."""
    if os.path.isfile(name) or not is_library_name(name):
        return None
    files = gto.basis.ALIAS.get(gto.basis._format_basis_name(name))
    if files is None:
        return ORBITAL  # a polarised Pople name, composed from orbital files
    kinds = {_file_kind(file) for file in library_files(files)}
    return kinds.pop() if len(kinds) == 1 else None


def _file_kind(file: str) -> str:
    return next((kind for pattern, kind in FILE_KINDS if pattern.search(file)), ORBITAL)


def fitting_mismatch(option: str, name: str, mp2fit: bool,
                     default: Callable[[], str | None]) -> str | None:
    """The warning for a fitting set ``name`` given with ``option`` that is not of the kind
    the option fits with (an orbital basis, or a JK-fit set for MP2), or None. ``default``
    gives the default set that the warning offers instead (None where PySCF has none)."""
    wanted = RI_FIT if mp2fit else JK_FIT
    kind = library_kind(name)
    if kind in (None, wanted):
        return None
    energy = "E_corr" if mp2fit else "E(SCF)"
    # Functions made for orbitals fit a density poorly (water in cc-pVDZ with --jk-auxbasis
    # cc-pvdz: E(SCF) 0.245 Eh low); a fitting set of another kind is close but less
    # accurate (cc-pvdz-ri for the SCF: 1e-3 Eh, against 2e-5 with cc-pvdz-jkfit).
    effect = (f"{energy} can be far off" if kind in (ORBITAL, F12_CABS)
              else f"{energy} is fitted less accurately")
    partner = default()
    remedy = (f"leave {option} out for the default, {partner}" if partner is not None
              else f"choose {KIND_NAMES[wanted]} with {option}")
    return f"{option} {name} is {KIND_NAMES[kind]}, not {KIND_NAMES[wanted]}, so {effect}; {remedy}"


def orbital_mismatch(basis: str) -> str | None:
    """The warning for a fitting set given as the orbital basis, or None: its functions are
    made to fit densities, not to hold orbitals (water with --basis cc-pvdz-jkfit: E(SCF)
    0.025 Eh above cc-pVDZ's and E_corr 60% larger; with weigend, E(SCF) 6 Eh above)."""
    kind = library_kind(basis)
    if kind in (None, ORBITAL):
        return None
    return (f"--basis {basis} is {KIND_NAMES[kind]}, not an orbital basis, so these energies "
            "are of no orbital basis; choose one such as cc-pvdz, and the fitting sets with "
            "--auxbasis and --jk-auxbasis")


def relativistic_contraction(name: str) -> bool:
    """Whether the library basis ``name`` is contracted for a scalar-relativistic
    Hamiltonian: one of its files is one that a DKH or RCC name of the library reads."""
    if os.path.isfile(name):
        return False
    files = gto.basis.ALIAS.get(gto.basis._format_basis_name(name))
    return files is not None and bool(set(library_files(files)) & _relativistic_files())


def _relativistic_files() -> set[str]:
    return {file for key, value in gto.basis.ALIAS.items() if RELATIVISTIC_NAME.search(key)
            for file in library_files(value)}


def relativistic_mismatch(basis: str) -> str | None:
    """The warning for an orbital basis contracted for a scalar-relativistic Hamiltonian,
    which dfmp2 does not have, or None."""
    if not relativistic_contraction(basis):
        return None
    plain = DK_SUFFIX.sub("", basis)
    remedy = (f"use {plain} for a non-relativistic calculation"
              if plain != basis and is_library_name(plain) and not relativistic_contraction(plain)
              else "choose a non-relativistic basis (cc-pvdz; def2-svp with its core potentials "
                   "for heavy elements)")
    return (f"--basis {basis} is contracted for a scalar-relativistic (Douglas-Kroll-Hess) "
            "Hamiltonian, but dfmp2 uses the non-relativistic one, so these energies are of "
            f"that mismatched pair (poor for heavy elements); {remedy}")
