"""Spin contamination of the reference: <S^2> of its determinant against S(S+1).

An unrestricted (UHF or UKS) determinant is no eigenfunction of S^2: its <S^2> exceeds
S(S+1) by the weight of higher spin states mixed into it, which MP2 built on it inherits.
"""
from __future__ import annotations

import numpy as np
from pyscf import gto, scf

from dfmp2.records.sections import StoredOrbitals

# An unrestricted reference whose <S^2> exceeds S(S+1) by more than this share of it (by
# more than this for a singlet) is spin-contaminated: the usual rule of thumb (+-10%) for
# when a determinant has mixed in enough of higher spin states to make the MP2 energy built
# on it questionable.
SPIN_CONTAMINATION_SHARE = 0.1


def spin_square(mol: gto.Mole, orbitals: StoredOrbitals) -> float:
    """<S^2> of the reference determinant of ``orbitals``: 0 for a restricted (closed-shell)
    one."""
    occupations = np.asarray(orbitals.mo_occ)
    if occupations.ndim == 1:
        return 0.0
    coefficients = np.asarray(orbitals.mo_coeff)
    occupied = tuple(coefficients[n][:, occupations[n] > 0] for n in range(2))
    return float(scf.uhf.spin_square(occupied, mol.intor_symmetric("int1e_ovlp"))[0])


def exact_spin_square(spin: int) -> float:
    """S(S+1) of a state of ``spin`` = 2S unpaired electrons."""
    return spin / 2 * (spin / 2 + 1)


def spin_contaminated(s2: float, spin: int) -> bool:
    """Whether <S^2> = ``s2`` strays from S(S+1) beyond :data:`SPIN_CONTAMINATION_SHARE`
    (False for NaN, an older record's)."""
    exact = exact_spin_square(spin)
    return s2 - exact > SPIN_CONTAMINATION_SHARE * (exact if exact > 0 else 1.0)
