"""Natural orbitals of a density: the eigenvectors of the density in an orthonormal orbital
basis, most occupied first, as PySCF's ``dfmp2_native.make_natorbs`` forms them (a UHF
density's spin sum in the alpha orbitals' basis)."""
from __future__ import annotations

import numpy as np


def natural_orbitals(density: np.ndarray, basis: np.ndarray,
                     overlap: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Occupations (descending) and natural orbitals (columns, AO basis) of the AO density
    ``density`` in the space of the orthonormal orbitals ``basis`` (C^T S C = 1: the SCF's,
    which span the basis less any linear dependence PySCF removed)."""
    projected = basis.T @ overlap
    occupations, vectors = np.linalg.eigh(projected @ density @ projected.T)
    order = np.argsort(occupations)[::-1]
    return occupations[order], basis @ vectors[:, order]
