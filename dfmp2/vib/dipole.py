"""The dipole moment of nuclei and an electron density, about a fixed origin."""
from __future__ import annotations

import numpy as np
from pyscf import gto


def dipole_moment(mol: gto.Mole, density: np.ndarray,
                  origin: np.ndarray | None = None) -> np.ndarray:
    """The dipole (x, y, z) in atomic units (e Bohr) of ``mol``'s nuclei (their charges less
    any core an ECP replaces) and the spin-summed AO ``density``, about ``origin`` (Bohr;
    default the coordinate origin). A dipole derivative must take every displaced geometry
    about the same origin: the nuclear term carries the displacement."""
    origin = np.zeros(3) if origin is None else np.asarray(origin, dtype=float)
    with mol.with_common_origin(origin):
        position = mol.intor_symmetric("int1e_r", comp=3)
    electronic = -np.einsum("xij,ji->x", position, np.asarray(density))
    nuclear = np.einsum("a,ax->x", mol.atom_charges(), mol.atom_coords() - origin)
    return electronic + nuclear
