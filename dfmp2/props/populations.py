"""Atomic charges of a density: Mulliken's (D S per atom) and Löwdin's (S^1/2 D S^1/2 per
atom), each the atom's nuclear charge (less core-potential electrons) minus its population."""
from __future__ import annotations

import numpy as np
from pyscf import gto


def _per_atom(mol: gto.Mole, populations: np.ndarray) -> np.ndarray:
    atoms = np.zeros(mol.natm)
    for atom, (_, _, p0, p1) in enumerate(mol.aoslice_by_atom()):
        atoms[atom] = populations[p0:p1].sum()
    return mol.atom_charges() - atoms


def mulliken_charges(mol: gto.Mole, density: np.ndarray, overlap: np.ndarray) -> np.ndarray:
    return _per_atom(mol, np.einsum("ij,ji->i", density, overlap))


def overlap_root(overlap: np.ndarray) -> np.ndarray:
    """S^1/2 (S is positive definite: the basis functions are)."""
    values, vectors = np.linalg.eigh(overlap)
    return (vectors * np.sqrt(values)) @ vectors.T


def lowdin_charges(mol: gto.Mole, density: np.ndarray, overlap: np.ndarray) -> np.ndarray:
    root = overlap_root(overlap)
    return _per_atom(mol, np.einsum("ij,jk,ki->i", root, density, root))
