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

from pyscf import gto

from dfmp2.errors import InputError


def file_digest(name: str) -> str:
    """``sha256:<hex>`` of the file a basis name reads, or empty for a library name."""
    if not os.path.isfile(name):
        return ""
    try:
        with open(name, "rb") as handle:
            return "sha256:" + hashlib.sha256(handle.read()).hexdigest()
    except OSError as exc:
        raise InputError(f"cannot read the basis file {name!r} ({exc.strerror})") from None


def refuse_shadowed_library_name(name: str, option: str) -> None:
    """Refuse a basis name that is both a PySCF library basis and a file here."""
    if os.path.isfile(name) and is_library_name(name):
        raise InputError(f"{option} {name!r} is a PySCF library basis, and a file of that name "
                         "is in this folder, which PySCF would read instead; give the file "
                         f"as ./{name} to use it, or rename it for the library basis")


def is_library_name(name: str) -> bool:
    """Whether PySCF's library has a basis of this name."""
    return gto.basis.ALIAS.get(gto.basis._format_basis_name(name)) is not None


def library_name_key(name: str) -> str:
    """A library basis name as PySCF looks it up (case, hyphens, underscores and spaces do not
    matter: STO-3G, sto-3g and sto3g are one basis); any other text as given."""
    if any(mark in name for mark in ":,{}[]/") or not is_library_name(name):
        return name
    return gto.basis._format_basis_name(name)


def same_basis_name(name: str) -> str:
    """The key two requests' ``--basis``-like names are compared by: a file's name as given
    (another file is another basis), a library name by :func:`library_name_key`."""
    return name if os.path.isfile(name) else library_name_key(name)
