"""Natural orbitals as a Molden file, through PySCF's writer, for Jmol, Avogadro or IboView.

The file is written as dfmp2 writes its records: into a new file in the target's folder,
created so that no link can redirect it, then renamed onto the target; a link or anything but
a regular file at the target is refused.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
from pyscf import gto
from pyscf.tools import molden

from dfmp2.system.files import StagedText, check_text_output, stage_text

REMEDY = "choose another --molden"


def check_molden_path(path: Path) -> None:
    """Refuse, before any work, a --molden target that could not be written or is a link."""
    check_text_output(path, "--molden", REMEDY)


def write_molden(path: Path, mol: gto.Mole, orbitals: np.ndarray,
                 occupations: np.ndarray) -> StagedText:
    """The orbitals (columns, AO basis) with their occupations, staged for ``path`` (in place
    once committed with the record); Molden's orbital energies are the orbitals' positions
    (PySCF's default), most occupied first."""
    def write(handle):
        molden.header(mol, handle)
        molden.orbital_coeff(mol, handle, orbitals, occ=occupations)

    return stage_text(path, write, REMEDY)
