"""Natural orbitals as a Molden file, through PySCF's writer, for Jmol, Avogadro or IboView.

The file is written as dfmp2 writes its records: into a new file in the target's folder,
created so that no link can redirect it, then renamed onto the target; a link or anything but
a regular file at the target is refused.
"""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np
from pyscf import gto
from pyscf.tools import molden

from dfmp2.errors import InputError, RunFailure
from dfmp2.system.files import refuse_hdf5, create_exclusive, disk_reason, refuse_unless_regular

REMEDY = "choose another --molden"
TEMPORARY = ".{}.molden.tmp"
# The longest file name most file systems take (the temporary's must fit too).
NAME_MAX = 255


def check_molden_path(path: Path) -> None:
    """Refuse, before any work, a Molden target that could not be written or is a link."""
    refuse_unless_regular(path, REMEDY)
    refuse_hdf5(path, "--molden", REMEDY)
    if len(os.fsencode(TEMPORARY.format(path.name))) > NAME_MAX:
        raise InputError(f"--molden name {path.name[:40]}... is too long; {REMEDY}")
    folder = path.parent if str(path.parent) else Path(".")
    if not folder.is_dir() or not os.access(folder, os.W_OK | os.X_OK):
        raise InputError(f"--molden folder {folder} is not a writable folder; {REMEDY}")


def write_molden(path: Path, mol: gto.Mole, orbitals: np.ndarray,
                 occupations: np.ndarray) -> Path:
    """The orbitals (columns, AO basis) with their occupations; Molden's orbital energies
    are the orbitals' positions (PySCF's default), most occupied first."""
    check_molden_path(path)
    temporary = path.with_name(TEMPORARY.format(path.name))
    try:
        # Readable by others, as a file a viewer opens is expected to be.
        with os.fdopen(create_exclusive(temporary, REMEDY, 0o644), "w") as handle:
            molden.header(mol, handle)
            molden.orbital_coeff(mol, handle, orbitals, occ=occupations)
        os.replace(temporary, path)
    except OSError as exc:
        temporary.unlink(missing_ok=True)
        raise RunFailure(f"could not write the Molden file {path}: "
                         f"{disk_reason(exc, 'free some space')}") from None
    return path
