"""The energy does not depend on block size, on the plain/fused path, or (within 1e-6) on fp32."""
from __future__ import annotations

import pytest

from conftest import pyscf_df_rhf, pyscf_molecule
from dfmp2.mp2.kernel import DFMP2


@pytest.fixture(scope="module")
def water_dimer_scf():
    return pyscf_df_rhf(pyscf_molecule("water_dimer", "cc-pvdz"))


def energy(mf, **options) -> float:
    return DFMP2(mf, frozen=2, **options).kernel()


def test_block_size_invariance(water_dimer_scf):
    energies = [energy(water_dimer_scf, occ_block=block) for block in (1, 3, 8)]
    assert max(energies) - min(energies) <= 1e-10
    assert energies[0] < -0.3


def test_plain_and_fused_agree(water_dimer_scf):
    for block in (2, 8):
        plain = energy(water_dimer_scf, occ_block=block)
        fused = energy(water_dimer_scf, occ_block=block, fused_energy=True)
        assert abs(plain - fused) <= 1e-10


def test_fp32_within_microhartree(water_dimer_scf):
    fp64 = energy(water_dimer_scf)
    fp32 = energy(water_dimer_scf, precision="fp32", occ_block=3)
    fp32_fused = energy(water_dimer_scf, precision="fp32", occ_block=3, fused_energy=True)
    assert abs(fp32 - fp64) <= 1e-6
    assert abs(fp32_fused - fp64) <= 1e-6


def test_kernel_calls_follow_the_block_structure(water_dimer_scf):
    pt = DFMP2(water_dimer_scf, frozen=2, occ_block=3)
    pt.kernel()
    calls = pt.kernel_set.accounting.as_attrs()
    # 8 active occupied orbitals in blocks of 3: blocks 3,3,2 -> 3 diagonal and 3 off-diagonal.
    assert calls["calls.syrk.torch-cpu"] == 3
    assert calls["calls.mp2_energy.torch-cpu"] == 6


def test_out_of_core_matches_in_memory(water_dimer_scf, tmp_path):
    def run(force: bool, fused: bool) -> float:
        pt = DFMP2(water_dimer_scf, frozen=2, memory=2 * 10**9, fused_energy=fused,
                   occ_block=3, scratch_dir=tmp_path)
        e_corr = pt.kernel(force_out_of_core=force)
        assert pt.result.plan.out_of_core is force
        return e_corr

    in_memory = run(False, False)
    assert abs(run(True, False) - in_memory) <= 1e-10
    assert abs(run(True, True) - in_memory) <= 1e-10
    assert not list(tmp_path.iterdir()), "the scratch file was not removed"


def test_kernel_calls_without_an_execution_share_nothing(water_dimer_scf):
    """Each mp2.kernel call gets its own pair ledger: finished pairs of one molecule must
    never stand in for another's."""
    from dfmp2.mp2 import kernel as mp2
    from dfmp2.df.auxbasis import ri_basis
    import kernels
    kernel_set = kernels.load("torch", "fp64")
    mf = water_dimer_scf

    def e_corr(mo_energy) -> float:
        orbitals = mp2.Orbitals(mo_energy, mf.mo_coeff, mf.mo_occ, 2)
        fit = mp2.fit_basis(mf.mol, ri_basis(mf.mol, None))
        plan = mp2.plan_for(orbitals.sizes(), fit.naux_fit, mf.mol.nao_nr(), kernel_set, 10**9,
                            False, 3)
        return mp2.kernel(mf.mol, orbitals, fit, kernel_set, plan).energies.e_corr

    shifted = mf.mo_energy.copy()
    shifted[mf.mo_occ == 0] += 0.1
    assert abs(e_corr(shifted) - e_corr(mf.mo_energy)) > 1e-3
