"""DF-MP2 energies against PySCF's DFMP2 on PySCF's own, independently converged SCF."""
from __future__ import annotations

import pytest
from pyscf.data import elements

from conftest import molecule_path, pyscf_df_rhf, pyscf_dfmp2_reference, pyscf_molecule
from dfmp2.jobs.run import run
from dfmp2.input.settings import RunSettings

CASES = [
    ("water", "sto-3g", False),
    ("water", "cc-pvdz", True),
    ("ammonia", "def2-svp", False),
    ("methane", "cc-pvdz", False),
    ("formaldehyde", "def2-svp", True),
    ("hydrogen_fluoride", "cc-pvtz", True),
    ("water_dimer", "cc-pvdz", False),
]


@pytest.mark.parametrize("name,basis,frozen_core", CASES)
def test_energy_matches_pyscf(name, basis, frozen_core, tmp_path):
    mol = pyscf_molecule(name, basis)
    nfrozen = elements.chemcore(mol) if frozen_core else 0
    reference = pyscf_dfmp2_reference(pyscf_df_rhf(mol), nfrozen)

    outcome = run(RunSettings(molecule=molecule_path(name), basis=basis, frozen_core=frozen_core,
                              backend="torch", output=tmp_path / "run.h5", show_progress=False))
    mp2 = outcome.record.groups["mp2"].attrs
    assert outcome.record.groups["sizes"].attrs["nfrozen"] == nfrozen
    assert abs(mp2["e_corr"] - reference.e_corr) <= 1e-8
    assert abs(mp2["e_os"] - reference.e_corr_os) <= 1e-8
    assert abs(mp2["e_ss"] - reference.e_corr_ss) <= 1e-8
    assert abs(mp2["e_tot"] - (reference._scf.e_tot + reference.e_corr)) <= 1e-8
