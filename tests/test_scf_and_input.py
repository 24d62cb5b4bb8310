"""SCF options and XYZ details: conventional SCF, unconverged SCF, charge/spin resolution."""
from __future__ import annotations

import json

import h5py
from pyscf import scf

import dfmp2.scf.reference
from conftest import molecule_path, pyscf_dfmp2_reference, pyscf_molecule
from dfmp2.input.molecule import resolve_charge_spin
from dfmp2.input.xyz import parse_xyz

WATER_CATION_COMMENT = "3\ncharge=2 multiplicity=1\nO 0 0 0\nH 0 0.757 0.587\nH 0 -0.757 0.587\n"


def test_conventional_scf_matches_pyscf(run_cli, tmp_path):
    mol = pyscf_molecule("water", "def2-svp")
    mf = scf.RHF(mol)
    mf.conv_tol, mf.conv_tol_grad, mf.verbose = 1e-12, 1e-7, 0
    mf.kernel()
    reference = pyscf_dfmp2_reference(mf, 1)
    result = run_cli("run", molecule_path("water"), "--basis", "def2-svp", "--scf",
                     "conventional", "--frozen", "1", "--backend", "torch", "--json",
                     "-o", tmp_path / "r.h5")
    assert result.code == 0, result.err
    summary = json.loads(result.out)
    assert abs(summary["e_scf"] - mf.e_tot) <= 1e-9
    assert abs(summary["e_corr"] - reference.e_corr) <= 1e-8


def test_unconverged_scf_is_an_error_unless_allowed(run_cli, tmp_path, monkeypatch):
    monkeypatch.setattr(dfmp2.scf.reference, "MAX_CYCLE", 2)
    record = tmp_path / "r.h5"
    result = run_cli("run", molecule_path("water"), "--backend", "torch", "-o", record)
    assert result.code == 1
    assert result.err.startswith("Error:") and "did not converge" in result.err
    with h5py.File(record, "r") as h5:
        assert h5.attrs["status"] == "failed"
        assert not h5["scf"].attrs["converged"]
        assert "mp2" not in h5
    allowed = run_cli("run", molecule_path("water"), "--backend", "torch",
                      "--allow-unconverged", "--json", "-o", record)
    assert allowed.code == 0, allowed.err
    with h5py.File(record, "r") as h5:
        assert h5.attrs["status"] == "complete" and not h5["scf"].attrs["converged"]


def test_charge_and_multiplicity_from_comment_and_flags():
    geometry = parse_xyz(WATER_CATION_COMMENT)
    assert (geometry.charge, geometry.multiplicity) == (2, 1)
    assert resolve_charge_spin(geometry, None, None) == (2, 0)
    assert resolve_charge_spin(geometry, 0, None) == (0, 0)
    plain = parse_xyz("2\nhydrogen\nH 0 0 0\nH 0 0 0.74\n")
    assert (plain.charge, plain.multiplicity) == (None, None)
    assert resolve_charge_spin(plain, None, None) == (0, 0)
    assert plain.coords[1, 2] == 0.74 and plain.symbols == ("H", "H")
