"""Dipole and traceless quadrupole moments of a density with its nuclei, in atomic units.

The quadrupole is Buckingham's traceless one, Theta_ij = 1/2 sum_k q_k (3 r_i r_j - r^2
delta_ij) over nuclei and electrons, as PySCF's ``quad_moment`` gives it (Psi4 prints the
traceless part Q_ij - delta_ij tr(Q)/3 of the plain second moment instead, 2/3 of this).
The nuclear charges are those the density sees: with a core potential, Z less its core
electrons; ghost atoms have none.
"""
from __future__ import annotations

import numpy as np
from pyscf import gto

from dfmp2.errors import InputError


def nuclear_charge_centre(mol: gto.Mole) -> np.ndarray:
    """sum_A Z_A R_A / sum_A Z_A (Bohr)."""
    charges = mol.atom_charges()
    if charges.sum() <= 0:
        raise InputError("the molecule has no nuclear charge to centre the moments on; "
                         "give --origin")
    return charges @ mol.atom_coords() / charges.sum()


def dipole(mol: gto.Mole, density: np.ndarray, origin: np.ndarray) -> np.ndarray:
    """sum_A Z_A (R_A - O) - tr(D r) for the total AO density D (e Bohr)."""
    with mol.with_common_orig(origin):
        integrals = mol.intor_symmetric("int1e_r", comp=3)
    electronic = np.einsum("xij,ji->x", integrals, density)
    return mol.atom_charges() @ (mol.atom_coords() - origin) - electronic


def quadrupole(mol: gto.Mole, density: np.ndarray, origin: np.ndarray) -> np.ndarray:
    """Theta (3 x 3, e Bohr^2) for the total AO density about ``origin``."""
    with mol.with_common_orig(origin):
        integrals = mol.intor_symmetric("int1e_rr", comp=9).reshape(3, 3, *density.shape)
    electronic = np.einsum("xyij,ji->xy", integrals, density)
    offsets = mol.atom_coords() - origin
    second = np.einsum("a,ax,ay->xy", mol.atom_charges(), offsets, offsets) - electronic
    return 0.5 * (3.0 * second - np.trace(second) * np.eye(3))
