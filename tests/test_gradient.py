"""The analytic DF-MP2 gradient against finite differences of the same energy.

The energy at displaced geometries is PySCF's: DF-RHF/DF-UHF with the JK-fit basis plus
PySCF's DFMP2/DFUMP2 with the RI basis (what dfmp2 reports, to 1e-10 Eh). Most checks are
directional: the derivative along one random unit vector (two energies) tests every
component of the gradient at once; water gets the full central-difference gradient.
"""
from __future__ import annotations

import json

import numpy as np
import pytest
from pyscf import df, gto, scf
from pyscf.mp import dfmp2 as pyscf_dfmp2
from pyscf.mp import dfump2 as pyscf_dfump2

from dfmp2.grad import kernel as gradient
from dfmp2.df.auxbasis import make_auxmol, ri_basis
from dfmp2.df.store import ScratchArea
from dfmp2.input.calculation import CalculationRequest, define_calculation
from dfmp2.errors import InputError
from dfmp2.grad.integrals import JkChannel, jk_pass, one_electron_gradient
from dfmp2.mp2.channels import split_channels
from dfmp2.mp2.methods import method_scales
from dfmp2.scf.reference import ScfOptions, run_scf
from dfmp2.scf.engine import scf_kernels
from dfmp2.input.xyz import read_xyz

from conftest import molecule_path, pyscf_molecule

STEP = 1e-3  # Bohr
TOLERANCE = 1e-6  # Eh/Bohr
TRANSLATION = 1e-8


# Tiny molecules: one thread each (see conftest.single_thread).
pytestmark = pytest.mark.usefixtures("single_thread")


def converged_scf(mol: gto.Mole, dm0=None) -> scf.hf.SCF:
    """DF-SCF with the JK-fit basis, converged tightly enough for clean finite differences."""
    mf = (scf.UHF(mol) if mol.spin else scf.RHF(mol)).density_fit(
        auxbasis=df.make_auxbasis(mol))
    # OH's nearly degenerate pi orbitals make the last digits of its UHF slow to converge.
    mf.conv_tol, mf.conv_tol_grad, mf.max_cycle, mf.verbose = 1e-12, 1e-9, 200, 0
    mf.kernel(dm0=dm0)
    assert mf.converged
    return mf


def total_energy(mf, nfrozen: int, scales: tuple[float, float]) -> float:
    mol = mf.mol
    method = pyscf_dfump2.DFUMP2 if mol.spin else pyscf_dfmp2.DFMP2
    pt = method(mf, frozen=nfrozen or None)
    pt.with_df = df.DF(mol, auxbasis=df.make_auxbasis(mol, mp2fit=True))
    pt.verbose = 0
    pt.kernel(with_t2=False)
    return mf.e_tot + scales[0] * pt.e_corr_os + scales[1] * pt.e_corr_ss


def displaced_energy(mf, displacement: np.ndarray, nfrozen: int,
                     scales: tuple[float, float]) -> float:
    coords = mf.mol.atom_coords() + displacement
    mol = mf.mol.set_geom_(coords, unit="Bohr", inplace=False)
    # Start from the reference density so every point lands on the same SCF solution.
    return total_energy(converged_scf(mol, mf.make_rdm1()), nfrozen, scales)


def central_difference(mf, direction: np.ndarray, nfrozen: int,
                       scales: tuple[float, float]) -> float:
    plus = displaced_energy(mf, STEP * direction, nfrozen, scales)
    minus = displaced_energy(mf, -STEP * direction, nfrozen, scales)
    return (plus - minus) / (2 * STEP)


def random_direction(natm: int, seed: int) -> np.ndarray:
    direction = np.random.default_rng(seed).standard_normal((natm, 3))
    return direction / np.linalg.norm(direction)


def check_directional(mf, nfrozen: int, scales: tuple[float, float], seed: int = 7):
    result = gradient.kernel(mf, nfrozen, scs=scales)
    assert result.e_tot == pytest.approx(total_energy(mf, nfrozen, scales), abs=1e-9)
    assert np.abs(result.gradient.sum(axis=0)).max() < TRANSLATION
    direction = random_direction(mf.mol.natm, seed)
    numeric = central_difference(mf, direction, nfrozen, scales)
    assert float(np.sum(result.gradient * direction)) == pytest.approx(numeric, abs=TOLERANCE)
    return result


def test_water_all_electron_full_finite_differences():
    mf = converged_scf(pyscf_molecule("water", "cc-pvdz"))
    result = gradient.kernel(mf, 0)
    assert result.e_tot == pytest.approx(total_energy(mf, 0, (1.0, 1.0)), abs=1e-9)
    assert np.abs(result.gradient.sum(axis=0)).max() < TRANSLATION
    numeric = np.zeros_like(result.gradient)
    for atom in range(mf.mol.natm):
        for axis in range(3):
            unit = np.zeros_like(numeric)
            unit[atom, axis] = 1.0
            numeric[atom, axis] = central_difference(mf, unit, 0, (1.0, 1.0))
    assert np.abs(result.gradient - numeric).max() < TOLERANCE


def test_frozen_core_hydrogen_fluoride():
    mf = converged_scf(pyscf_molecule("hydrogen_fluoride", "cc-pvdz"))
    check_directional(mf, nfrozen=1, scales=(1.0, 1.0))


def test_scs_mp2_bent_water_frozen_core():
    mol = pyscf_molecule("water", "cc-pvdz")
    # Off the symmetric geometry, so that no gradient component vanishes by symmetry.
    mol = mol.set_geom_(mol.atom_coords() + 0.05 * random_direction(mol.natm, 3), unit="Bohr",
                        inplace=False)
    check_directional(converged_scf(mol), nfrozen=1,
                      scales=method_scales("scs-mp2"))


def test_uhf_doublet_hydroxyl():
    mf = converged_scf(pyscf_molecule("hydroxyl", "cc-pvdz", spin=1))
    check_directional(mf, nfrozen=0, scales=(1.0, 1.0))


def test_uhf_sos_mp2_frozen_core_hydroxyl():
    mf = converged_scf(pyscf_molecule("hydroxyl", "cc-pvdz", spin=1))
    check_directional(mf, nfrozen=1, scales=method_scales("sos-mp2"), seed=11)


def test_uhf_without_beta_electrons_quartet_h3():
    """Only same-spin alpha pairs: the beta spin has no electron (this was refused)."""
    mol = gto.M(atom="H 0 0 0; H 0 0 2.0; H 0 1.8 0.5", basis="cc-pvdz", spin=3, verbose=0)
    check_directional(converged_scf(mol), nfrozen=0, scales=(1.0, 1.0), seed=5)


def test_a_spin_whose_only_occupied_orbital_is_frozen_lithium_hydride_cation():
    """LiH+ with one orbital of each spin frozen: the beta spin has no active orbital."""
    mol = gto.M(atom="Li 0 0 0; H 0 0 1.9", basis="cc-pvdz", charge=1, spin=1, verbose=0)
    check_directional(converged_scf(mol), nfrozen=1, scales=(1.0, 1.0), seed=3)


def test_one_electron_h2_cation_is_pyscf_df_uhf_gradient():
    """No electron pair, no correlation: the gradient is the DF-UHF one."""
    mol = gto.M(atom="H 0 0 0; H 0 0 1.05", basis="cc-pvdz", charge=1, spin=1, verbose=0)
    mf = converged_scf(mol)
    result = gradient.kernel(mf, 0)
    assert result.e_tot == pytest.approx(mf.e_tot, abs=1e-12)
    assert np.abs(result.gradient - mf.nuc_grad_method().kernel()).max() < 1e-9


def test_scf_terms_match_pyscf_df_rhf_gradient():
    """With no MP2 density, the JK-fit and one-electron terms are PySCF's DF-RHF gradient."""
    mf = converged_scf(pyscf_molecule("water", "cc-pvdz"))
    occupied = mf.mo_occ > 0
    c_occ = mf.mo_coeff[:, occupied]
    energy_weighted = 2.0 * (c_occ * mf.mo_energy[occupied]) @ c_occ.T
    auxmol = df.addons.make_auxmol(mf.mol, df.make_auxbasis(mf.mol))
    ours = jk_pass(mf.mol, auxmol, [JkChannel(c_occ, np.zeros_like(energy_weighted), 2.0)],
                   64, 1e-7)
    ours += one_electron_gradient(mf.mol, 2.0 * c_occ @ c_occ.T, energy_weighted)
    assert np.abs(ours - mf.nuc_grad_method().kernel()).max() < 1e-10


def test_kernel_engine_reference_gives_the_same_gradient():
    """dfmp2's own SCF (J/K on the kernels, its JK tensor released after the SCF as the
    pipeline does) gives the gradient of the PySCF reference."""
    calc = define_calculation(read_xyz(molecule_path("water")), CalculationRequest())
    ours = run_scf(calc, ScfOptions("kernels", scf_kernels("torch", None), 2 * 10**9))
    result = gradient.kernel(ours.mf, 0, calc.auxbasis, calc.jk_auxbasis)
    reference = gradient.kernel(converged_scf(pyscf_molecule("water", "cc-pvdz")), 0)
    assert result.e_tot == pytest.approx(reference.e_tot, abs=1e-9)
    assert np.abs(result.gradient - reference.gradient).max() < 1e-7


@pytest.mark.parametrize("name, spin", [("water", 0), ("hydroxyl", 1)])
def test_occupied_blocks_do_not_change_the_gradient(name, spin):
    """Small molecules fit in one slab; blocks of two orbitals test the blocked sweep."""
    mf = converged_scf(pyscf_molecule(name, "cc-pvdz", spin=spin))
    whole = gradient.kernel(mf, 0)
    blocked = gradient.kernel(mf, 0, occ_block=2)
    assert blocked.e_corr == pytest.approx(whole.e_corr, abs=1e-12)
    assert np.abs(blocked.gradient - whole.gradient).max() < 1e-10


@pytest.mark.parametrize("name, spin, nfrozen", [("water", 0, 1), ("hydroxyl", 1, 0)])
def test_out_of_core_tensors_do_not_change_the_gradient(name, spin, nfrozen, tmp_path):
    """A budget below twice the placed tensors puts B, Gamma and the JK pass's integrals in
    scratch files, B read in blocks of a few orbitals; the files are gone afterwards."""
    mf = converged_scf(pyscf_molecule(name, "cc-pvdz", spin=spin))
    in_memory = gradient.kernel(mf, nfrozen)
    channels = split_channels(mf.mo_energy, mf.mo_coeff, mf.mo_occ, nfrozen)
    naux_ri = gradient.fit_basis(mf.mol, ri_basis(mf.mol, None)).metric.naux_fit
    naux_jk = make_auxmol(mf.mol, gradient.scf_jk_basis(mf)).nao_nr()
    budget = gradient.held_bytes(channels, naux_ri, naux_jk, mf.mol.nao_nr())
    storage = gradient.plan_storage(channels, naux_ri, naux_jk, mf.mol.nao_nr(), budget,
                                    ScratchArea(tmp_path, "plan"))
    assert storage.out_of_core
    assert storage.row_block < min(len(c.active) for c in channels)
    out_of_core = gradient.kernel(mf, nfrozen, budget=budget,
                                  scratch=ScratchArea(tmp_path, "grad"))
    assert out_of_core.e_corr == pytest.approx(in_memory.e_corr, abs=1e-12)
    assert np.abs(out_of_core.gradient - in_memory.gradient).max() < 1e-10
    assert list(tmp_path.iterdir()) == []


def test_budget_without_scratch_or_room_is_refused(tmp_path):
    mf = converged_scf(pyscf_molecule("water", "cc-pvdz"))
    with pytest.raises(InputError, match="no scratch folder"):
        gradient.kernel(mf, 0, budget=10**5)
    with pytest.raises(InputError, match="too small for this gradient"):
        gradient.kernel(mf, 0, budget=10**4, scratch=ScratchArea(tmp_path, "grad"))


def test_refuses_what_it_cannot_differentiate():
    water = pyscf_molecule("water", "cc-pvdz")
    conventional = scf.RHF(water).run(verbose=0)
    with pytest.raises(InputError, match="density-fitted"):
        gradient.kernel(conventional, 0)
    with pytest.raises(InputError, match="not the one the SCF"):
        gradient.kernel(converged_scf(water), 0, jk_aux="def2-universal-jkfit")


H4_CHAIN = "H 0 0 0; H 0 0 0.45; H 0 0 0.90; H 0 0 1.35"


def test_a_nearly_dependent_basis_is_said_and_its_gradient_is_warned_of(run_cli, tmp_path,
                                                                        caplog):
    """An H4 chain 0.45 A apart in aug-cc-pVTZ: PySCF's SCF leaves 4 combinations of its 92
    functions out (overlap eigenvalues below 1e-6), and so do ours, silently. The energies
    are PySCF's; the analytic gradient, PySCF's as ours, takes the space left out as fixed
    while it moves with the atoms, and was 9.1e-6 Eh/Bohr off the energy's central
    differences on atom 2 (1e-3 Bohr steps), with nothing said. Now the run says so, the
    record counts them, and a gradient is warned of."""
    xyz = tmp_path / "h4.xyz"
    lines = [part.strip() for part in H4_CHAIN.split(";")]
    xyz.write_text(f"{len(lines)}\nH4 chain\n" + "\n".join(lines) + "\n")
    mol = gto.M(atom=H4_CHAIN, basis="aug-cc-pvtz", verbose=0)
    removed = int(np.count_nonzero(np.linalg.eigvalsh(mol.intor("int1e_ovlp")) < 1e-6))
    assert removed == 4
    mf = scf.RHF(mol).density_fit(auxbasis=df.make_auxbasis(mol))
    mf.conv_tol, mf.conv_tol_grad = 1e-12, 1e-7
    mf.kernel()
    assert mf.mo_coeff.shape[1] == mol.nao - removed
    mp = pyscf_dfmp2.DFMP2(mf)
    mp.with_df = df.DF(mol, auxbasis=df.make_auxbasis(mol, mp2fit=True))
    e_corr = mp.kernel()[0]

    result = run_cli("run", xyz, "--basis", "aug-cc-pvtz", "--json", "-o", tmp_path / "r.h5")
    assert result.code == 0, result.err
    summary = json.loads(result.out)
    assert summary["removed_combinations"] == removed
    assert summary["e_scf"] == pytest.approx(mf.e_tot, abs=1e-9)
    assert summary["e_corr"] == pytest.approx(e_corr, abs=1e-8)
    assert "nearly linearly dependent: 4 of its 92" in caplog.text
    assert "4 combinations of its functions" in run_cli("show", tmp_path / "r.h5").out
    assert "analytic gradient" not in caplog.text

    gradient_run = run_cli("gradient", xyz, "--basis", "aug-cc-pvtz", "-o", tmp_path / "g.h5")
    assert gradient_run.code == 0, gradient_run.err
    assert "analytic gradient leaves out how the 4 combinations" in caplog.text
    assert "not exactly the energy's derivative" in run_cli("show", tmp_path / "g.h5").out
