"""Every property ``dfmp2 properties`` reports, from one density given per spin channel (one
spin-summed closed-shell density, or UHF's alpha and beta)."""
from __future__ import annotations

import numpy as np
from pyscf import gto

from dfmp2.props.moments import dipole, quadrupole
from dfmp2.props.natural import natural_orbitals
from dfmp2.props.populations import lowdin_charges, mulliken_charges
from dfmp2.records.properties_section import DensityProperties


def analyse(mol: gto.Mole, densities: list[np.ndarray], mo_coeff: np.ndarray,
            origin: np.ndarray) -> DensityProperties:
    """The properties of the AO ``densities`` (per channel) about ``origin`` (Bohr); natural
    orbitals in the space of the reference orbitals ``mo_coeff`` (2-D, or UHF's alpha and
    beta), the spin sum in the first channel's (PySCF's choice for UHF)."""
    total = sum(densities)
    overlap = mol.intor_symmetric("int1e_ovlp")
    bases = [mo_coeff] if np.ndim(mo_coeff) == 2 else list(mo_coeff)
    occupations, orbitals = natural_orbitals(total, bases[0], overlap)
    per_spin = [None, None]
    if len(densities) == 2:
        per_spin = [natural_orbitals(d, c, overlap)[0] for d, c in zip(densities, bases)]
    return DensityProperties(dipole(mol, total, origin), quadrupole(mol, total, origin),
                             mulliken_charges(mol, total, overlap),
                             lowdin_charges(mol, total, overlap), occupations, orbitals,
                             *per_spin)
