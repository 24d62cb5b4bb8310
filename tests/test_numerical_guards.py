"""Non-finite kernel output and non-aufbau references are reported, not summed."""
from __future__ import annotations

import h5py
import numpy as np
import pytest
from pyscf import df

import kernels
from conftest import molecule_path, pyscf_df_rhf, pyscf_molecule
from dfmp2.errors import RunFailure
from dfmp2.jobs.run import run
from dfmp2.input.settings import RunSettings
from dfmp2.mp2 import kernel as mp2
from dfmp2.df.auxbasis import ri_basis
from dfmp2.scf import jk_tensor
from dfmp2.scf.jk_tensor_build import build_jk_tensor


@pytest.fixture(scope="module")
def water_scf():
    return pyscf_df_rhf(pyscf_molecule("water", "cc-pvdz"))


def _kernel(mf, kernel_set, mo_energy=None):
    orbitals = mp2.Orbitals(mf.mo_energy if mo_energy is None else mo_energy, mf.mo_coeff,
                            mf.mo_occ)
    fit = mp2.fit_basis(mf.mol, ri_basis(mf.mol, None))
    plan = mp2.plan_for(orbitals.sizes(), fit.naux_fit, mf.mol.nao_nr(), kernel_set, 10**9,
                        False, 2)
    return mp2.kernel(mf.mol, orbitals, fit, kernel_set, plan,
                      mp2.Execution(show_progress=False))


def test_nan_from_the_energy_kernel_names_the_block(water_scf, monkeypatch):
    kern = kernels.load("torch", "fp64")
    real = kern.mp2_energy

    def poisoned(block, d_row, d_col, nvir, diagonal_block):
        direct, exchange = real(block, d_row, d_col, nvir, diagonal_block)
        return (float("nan"), exchange) if not diagonal_block else (direct, exchange)

    monkeypatch.setattr(kern, "mp2_energy", poisoned)
    with pytest.raises(RunFailure, match=r"occupied blocks \[0:2\] x \[2:4\]"):
        _kernel(water_scf, kern)


def test_inf_from_trsm_names_the_orbitals(water_scf, monkeypatch):
    kern = kernels.load("torch", "fp64")
    real = kern.trsm

    def poisoned(l, b, out=None):
        x = real(l, b, out=out)
        x[0, 0] = float("inf")
        return x

    monkeypatch.setattr(kern, "trsm", poisoned)
    with pytest.raises(RunFailure, match="non-finite values in the fitted tensor B"):
        _kernel(water_scf, kern)


def test_nan_in_a_jk_integral_row_is_reported_not_screened(monkeypatch):
    """A row holding a NaN has no norm below the screening threshold: it is fitted and the
    tensor's build stops on it, instead of storing it as a screened zero."""
    mol = pyscf_molecule("water", "cc-pvdz")
    auxmol = df.addons.make_auxmol(mol, df.make_auxbasis(mol))
    real = jk_tensor.unit_integrals

    def poisoned(mol, auxmol, unit):
        values = np.array(real(mol, auxmol, unit))
        values[-1, :] = 0.0
        values[-1, 0] = float("nan")
        return values

    monkeypatch.setattr(jk_tensor, "unit_integrals", poisoned)
    with pytest.raises(RunFailure, match="non-finite values in the SCF's JK-fit tensor"):
        build_jk_tensor(mol, auxmol, kernels.load("torch", "fp64"), 10**9, None)


def test_non_aufbau_occupation_is_refused(water_scf):
    mo_energy = np.array(water_scf.mo_energy)
    homo = int(np.count_nonzero(water_scf.mo_occ)) - 1
    mo_energy[homo] = mo_energy[homo + 1] + 0.1
    with pytest.raises(RunFailure, match="non-aufbau"):
        _kernel(water_scf, kernels.load("torch", "fp64"), mo_energy)


def test_failed_run_record_says_failed(tmp_path, monkeypatch):
    import dfmp2.mp2.pairs
    monkeypatch.setattr(dfmp2.mp2.pairs, "orbital_denominators",
                        lambda *a: (_ for _ in ()).throw(RunFailure("non-aufbau (test)")))
    record = tmp_path / "r.h5"
    with pytest.raises(RunFailure):
        run(RunSettings(molecule=molecule_path("water"), backend="torch", output=record,
                        show_progress=False))
    with h5py.File(record, "r") as h5:
        assert h5.attrs["status"] == "failed" and "non-aufbau" in h5.attrs["error"]
