"""Auxiliary basis sets: the RI (MP2-fit) basis of MP2 and the JK-fit basis of the SCF.

Defaults follow PySCF's ``df.make_auxbasis``: the fitting partner of the orbital basis for each
element (e.g. cc-pvdz-ri, def2-universal-jkfit), and PySCF's even-tempered set generated from
the orbital basis for an element the partner lacks (iodine in def2-svp-ri, lithium in
cc-pvdz-jkfit). Either way the set is deterministic for a molecule and basis, so a record only
needs its readable name and whether the user chose it.
"""
from __future__ import annotations

import contextlib
import io
import warnings
from dataclasses import dataclass

from pyscf import df, gto
from pyscf.data import elements
from pyscf.lib.exceptions import BasisNotFoundError

from dfmp2.errors import InputError
from dfmp2.input.basis_files import (BASIS_ERRORS, POPLE_BASE, as_pyscf_reads, basis_error_text,
                                     refuse_misread_basis, refuse_shadowed_library_name)

GENERATED = "even-tempered (PySCF)"
DEFAULT_OPTION = "default"
# The name under which PySCF generates every element's fitting set (ORCA's AutoAux recipe).
AUTOAUX = "autoaux"


@dataclass(frozen=True)
class AuxBasis:
    """An auxiliary basis as PySCF takes it (``spec``) and as people read it (``name``)."""

    spec: str | dict
    name: str
    option: str  # the user's --auxbasis, or "default"


def describe(spec: str | dict) -> str:
    """``cc-pvdz-ri``, or ``def2-svp-ri (C H); even-tempered (PySCF) (I)`` for a mixture."""
    if not isinstance(spec, dict):
        return str(spec)
    by_name: dict[str, list[str]] = {}
    for element, value in spec.items():
        by_name.setdefault(value if isinstance(value, str) else GENERATED, []).append(element)
    if len(by_name) == 1:
        return next(iter(by_name))
    return "; ".join(f"{name} ({' '.join(sorted(elements))})"
                     for name, elements in sorted(by_name.items()))


def ri_basis(mol: gto.Mole, option: str | None) -> AuxBasis:
    """The MP2 fitting basis: ``option`` (a PySCF basis name) or the RI partner of the basis."""
    if option is not None:
        return _checked(mol, AuxBasis(option_spec(mol, option), option, option), "--auxbasis",
                        "cc-pvdz-ri")
    spec = default_spec(mol, mp2fit=True)
    return _checked(mol, AuxBasis(spec, describe(spec), DEFAULT_OPTION), "--auxbasis",
                    "cc-pvdz-ri")


def jk_basis(mol: gto.Mole, option: str | None = None) -> AuxBasis:
    """The SCF's JK-fit basis: ``option`` (``--jk-auxbasis``, a PySCF basis name), else
    PySCF's default, with generated functions where it has none."""
    if option is not None:
        return _checked(mol, AuxBasis(option_spec(mol, option), option, option),
                        "--jk-auxbasis", "def2-universal-jkfit")
    spec = default_spec(mol, mp2fit=False)
    return _checked(mol, AuxBasis(spec, describe(spec), DEFAULT_OPTION), "--jk-auxbasis",
                    "def2-universal-jkfit")


def option_spec(mol: gto.Mole, option: str) -> str | dict:
    """The fitting set an ``--auxbasis`` or ``--jk-auxbasis`` name gives, as PySCF takes it.
    PySCF's generated ``autoaux`` set of a ghost atom comes from a nuclear charge of zero, so
    a counterpoise monomer was not in the dimer's fitting basis (the water dimer's E_int
    moved by 4e-7 Eh): with ghosts, every atom gets its element's generated set."""
    labels = {label for label, _ in mol._atom}
    if option != AUTOAUX or all(_element(label) == label for label in labels):
        return as_pyscf_reads(option)
    generated = df.autoaux(_ghosts_made_real(mol))
    return {label: generated[_element(label)] for label in labels}


def default_name(mol: gto.Mole, mp2fit: bool) -> str | None:
    """The default fitting set's readable name, or None where PySCF cannot make one."""
    try:
        return describe(default_spec(mol, mp2fit))
    except InputError:
        return None


def default_spec(mol: gto.Mole, mp2fit: bool) -> dict:
    """PySCF's default fitting set per atom label. A ghost atom (a counterpoise partner)
    gets its element's set: PySCF generates a ghost's set from a nuclear charge of zero, so
    a ghost iodine in def2-SVP-RI got 12 s functions instead of iodine's 225, and the
    monomer in the dimer basis was not in the dimer's fitting basis."""
    # PySCF reads a name as a file when one of that name is here: a file named like the
    # default partner (def2-svp-jkfit) replaced it, 0.1 Eh off, with the library name recorded
    # (or, unreadable, sent PySCF to generated functions without a word).
    predefined = getattr(df.addons, "predefined_auxbasis", None)
    partner = (predefined(mol, mol.basis, "HF", mp2fit)
               if predefined is not None and isinstance(mol.basis, str) else None)
    spec = _pyscf_default(mol, mp2fit)
    names = {value for value in spec.values() if isinstance(value, str)}
    for name in sorted(names | ({partner} if isinstance(partner, str) else set())):
        refuse_shadowed_library_name(name, "the default fitting basis")
    generated_ghosts = [label for label, value in spec.items()
                        if _element(label) != label and not isinstance(value, str)]
    if not generated_ghosts:
        return spec
    real = _pyscf_default(_ghosts_made_real(mol), mp2fit)
    spec.update((label, real[_element(label)]) for label in generated_ghosts)
    return spec


def _pyscf_default(mol: gto.Mole, mp2fit: bool) -> dict:
    """PySCF's ``make_auxbasis``. For some bases it names a partner that it cannot load
    itself (6-31G** and 6-311G**: a KeyError from its Pople-name parser in PySCF 2.14, with
    or without basis-set-exchange), or its even-tempered generator fails (a ValueError for
    lithium in the weigend fitting set taken as the orbital basis), so the user must name
    one."""
    option, kind, example = ("--auxbasis", "RI", "cc-pvdz-ri") if mp2fit else (
        "--jk-auxbasis", "JK-fit", "def2-universal-jkfit")
    family = (POPLE_BASE.match(gto.basis._format_basis_name(mol.basis))
              if isinstance(mol.basis, str) else None)
    partners = getattr(df.addons, "DEFAULT_AUXBASIS", {}).get(family[0] if family else None)
    if partners:
        # 6-311G** is triple zeta: the 6-311G family's partner, not a double-zeta example.
        example = partners[1 if mp2fit else 0]
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return df.make_auxbasis(mol, mp2fit=mp2fit)
    except (KeyError, BasisNotFoundError, ValueError):
        raise InputError(f"PySCF cannot make its default {kind} fitting basis for "
                         f"{mol.basis!r} on this molecule; give one with {option}, for "
                         f"example {option} {example}") from None


def _element(label: str) -> str:
    """The element of an atom label, without a ghost prefix (``GHOST-I``, ``X-I``: ``I``)."""
    return elements._std_symbol_without_ghost(label)


def _ghosts_made_real(mol: gto.Mole) -> gto.Mole:
    """``mol`` with its ghost atoms as atoms of their element, in the same orbital basis
    (named as given, so PySCF finds the same fitting partners), without ECPs: what chooses a
    fitting set is the basis and the nuclear charge."""
    basis = mol.basis
    if isinstance(basis, dict):
        # A real atom's entry wins over a ghost's of the same element.
        real_labels = {label: value for label, value in basis.items()
                       if label == "default" or _element(label) == label}
        basis = {**{_element(label): value for label, value in basis.items()
                    if label not in real_labels}, **real_labels}
    real = gto.Mole(atom=[(_element(label), coords) for label, coords in mol._atom],
                    basis=basis, unit="Bohr", verbose=0)
    for spin in (0, 1):
        real.spin = spin
        try:
            return real.build()
        except RuntimeError:
            continue
    raise RuntimeError("no spin fits the electrons of the molecule's atoms")


def make_auxmol(mol: gto.Mole, aux: AuxBasis, option: str = "--auxbasis") -> gto.Mole:
    try:
        # PySCF prints its advice on a basis lacking an element to stdout, which is the
        # --json output's; the error below says it in one line.
        with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
            warnings.simplefilter("ignore")
            return df.addons.make_auxmol(mol, aux.spec)
    except BASIS_ERRORS as exc:
        raise InputError(f"auxiliary basis '{aux.name}' cannot be used for this molecule "
                         f"({basis_error_text(exc)}); choose another with {option}") from None


def _checked(mol: gto.Mole, aux: AuxBasis, option: str, example: str) -> AuxBasis:
    if not aux.name.strip():
        raise InputError(f"{option} is empty; give a PySCF basis name such as {example}")
    if aux.option != DEFAULT_OPTION:
        refuse_misread_basis(aux.option, option, [_element(label) for label, _ in mol._atom])
    make_auxmol(mol, aux, option)
    return aux
