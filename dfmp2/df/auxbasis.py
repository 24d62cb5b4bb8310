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

from dfmp2.errors import InputError

GENERATED = "even-tempered (PySCF)"
DEFAULT_OPTION = "default"


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
    if option:
        return _checked(mol, AuxBasis(option, option, option), "--auxbasis", "cc-pvdz-ri")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        spec = df.make_auxbasis(mol, mp2fit=True)
    return _checked(mol, AuxBasis(spec, describe(spec), DEFAULT_OPTION), "--auxbasis",
                    "cc-pvdz-ri")


def jk_basis(mol: gto.Mole, option: str | None = None) -> AuxBasis:
    """The SCF's JK-fit basis: ``option`` (``--jk-auxbasis``, a PySCF basis name), else
    PySCF's default, with generated functions where it has none."""
    if option is not None:
        return _checked(mol, AuxBasis(option, option, option), "--jk-auxbasis",
                        "def2-universal-jkfit")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        spec = df.make_auxbasis(mol)
    return _checked(mol, AuxBasis(spec, describe(spec), DEFAULT_OPTION), "--jk-auxbasis",
                    "def2-universal-jkfit")


def make_auxmol(mol: gto.Mole, aux: AuxBasis, option: str = "--auxbasis") -> gto.Mole:
    try:
        # PySCF prints its advice on a basis lacking an element to stdout, which is the
        # --json output's; the error below says it in one line.
        with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
            warnings.simplefilter("ignore")
            return df.addons.make_auxmol(mol, aux.spec)
    except (RuntimeError, KeyError, ValueError, TypeError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise InputError(f"auxiliary basis '{aux.name}' cannot be used for this molecule "
                         f"({first.strip()}); choose another with {option}") from None


def _checked(mol: gto.Mole, aux: AuxBasis, option: str, example: str) -> AuxBasis:
    if not aux.name.strip():
        raise InputError(f"{option} is empty; give a PySCF basis name such as {example}")
    make_auxmol(mol, aux, option)
    return aux
