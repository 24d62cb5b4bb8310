"""UHF DF-MP2 against PySCF's DFUMP2 (each from its own SCF), and SCS/SOS arithmetic."""
from __future__ import annotations

import dataclasses
import json

import h5py
import pytest
from pyscf import df, scf
from pyscf.data import elements
from pyscf.mp import dfump2

from conftest import molecule_path, pyscf_molecule
from dfmp2.input.calculation import CalculationRequest, define_calculation
from dfmp2.input.settings import RunSettings
from dfmp2.input.xyz import read_xyz
from dfmp2.jobs.run import run
from dfmp2.records.sections import read_scf
from dfmp2.scf import reference
from dfmp2.scf.reference import ScfOptions, restored_scf

OPEN_SHELL = [("hydroxyl", 1), ("methyl", 1), ("amino", 1), ("oxygen", 2), ("methylene", 2)]


def pyscf_dfump2(name: str, spin: int, frozen: int):
    mf = scf.UHF(pyscf_molecule(name, "cc-pvdz", spin=spin)).density_fit()
    mf.conv_tol, mf.conv_tol_grad, mf.verbose = 1e-12, 1e-7, 0
    mf.kernel()
    assert mf.converged
    pt = dfump2.DFUMP2(mf, frozen=frozen or None)
    pt.with_df = df.DF(mf.mol, auxbasis=df.make_auxbasis(mf.mol, mp2fit=True))
    pt.verbose = 0
    pt.kernel(with_t2=False)
    return pt


@pytest.mark.parametrize("name,spin", OPEN_SHELL)
def test_uhf_matches_pyscf_dfump2(name, spin, tmp_path):
    nfrozen = elements.chemcore(pyscf_molecule(name, "cc-pvdz", spin=spin))
    reference = pyscf_dfump2(name, spin, frozen=nfrozen)
    outcome = run(RunSettings(molecule=molecule_path(name), backend="torch", frozen_core=True,
                              occ_block=2, output=tmp_path / "u.h5", show_progress=False))
    record = outcome.record
    assert record.groups["input"].attrs["reference"] == "uhf"
    assert record.groups["input"].attrs["spin"] == spin
    sizes = record.groups["sizes"].attrs
    assert sizes["nocc"] - sizes["nocc_beta"] == spin and sizes["nfrozen"] == nfrozen
    mp2 = record.groups["mp2"].attrs
    assert abs(mp2["e_corr"] - reference.e_corr) <= 1e-8
    assert abs(mp2["e_os"] - reference.e_corr_os) <= 1e-8
    assert abs(mp2["e_ss"] - reference.e_corr_ss) <= 1e-8
    assert abs(mp2["e_ss_alpha"] + mp2["e_ss_beta"] - mp2["e_ss"]) <= 1e-14


def test_uhf_all_electron_fused_and_check(run_cli, tmp_path):
    reference = pyscf_dfump2("oxygen", 2, frozen=0)
    result = run_cli("run", molecule_path("oxygen"), "--backend", "torch", "--fused-energy",
                     "--occ-block", "3", "--check", "--json", "-o", tmp_path / "o2.h5")
    assert result.code == 0, result.err
    summary = json.loads(result.out)
    assert abs(summary["e_corr"] - reference.e_corr) <= 1e-8
    assert summary["check_passed"] is True


def test_uhf_of_a_closed_shell_equals_rhf(tmp_path):
    def e_corr(reference: str) -> float:
        outcome = run(RunSettings(molecule=molecule_path("water"), backend="torch",
                                  reference=reference, output=tmp_path / f"{reference}.h5",
                                  show_progress=False))
        return outcome.record.groups["mp2"].attrs["e_corr"]
    assert abs(e_corr("uhf") - e_corr("rhf")) <= 1e-8


def test_rhf_with_spin_is_refused(run_cli, tmp_path):
    result = run_cli("run", molecule_path("hydroxyl"), "--reference", "rhf", "--backend", "torch",
                     "-o", tmp_path / "x.h5")
    assert result.code == 2 and "use --reference uhf" in result.err


def test_scs_and_sos_arithmetic(run_cli, tmp_path):
    result = run_cli("run", molecule_path("water"), "--backend", "torch", "--scs-os", "1.1",
                     "--scs-ss", "0.5", "--json", "-o", tmp_path / "w.h5")
    assert result.code == 0, result.err
    s = json.loads(result.out)
    assert s["e_scs"] == pytest.approx(1.1 * s["e_os"] + 0.5 * s["e_ss"], abs=1e-14)
    assert s["e_sos"] == pytest.approx(1.3 * s["e_os"], abs=1e-14)
    assert s["e_corr"] == pytest.approx(s["e_os"] + s["e_ss"], abs=1e-14)
    default = run_cli("run", molecule_path("water"), "--backend", "torch", "--json",
                      "-o", tmp_path / "d.h5")
    d = json.loads(default.out)
    assert d["e_scs"] == pytest.approx(1.2 * d["e_os"] + d["e_ss"] / 3, abs=1e-14)


def test_compare_against_pyscf_uses_the_records_uhf_reference(run_cli, tmp_path):
    """compare --reference pyscf once built RHF (PySCF's ROHF for spin > 0): 48 mEh off."""
    record = tmp_path / "oh.h5"
    assert run_cli("run", molecule_path("hydroxyl"), "--backend", "torch", "--frozen-core",
                   "-o", record).code == 0
    result = run_cli("compare", record, "--reference", "pyscf", "--json")
    assert result.code == 0, result.err
    row = json.loads(result.out)[0]
    assert abs(row["delta_e_corr"]) < 1e-8 and abs(row["delta_e_tot"]) < 1e-8
    reference = pyscf_dfump2("hydroxyl", 1, frozen=1)
    assert abs(row["e_corr"] - reference.e_corr) <= 1e-8


def test_compare_recomputes_a_generated_auxiliary_basis(run_cli, tmp_path):
    """Iodine has no def2-svp-ri partner in PySCF: the RI set is generated, and compare
    rebuilds it from the record instead of reading it back from a string."""
    from pathlib import Path
    ch3i = Path(__file__).resolve().parent / "hostile" / "methyl_iodide.xyz"
    record = tmp_path / "ch3i.h5"
    assert run_cli("run", ch3i, "--basis", "def2-svp", "--frozen-core", "--backend", "torch",
                   "-o", record).code == 0
    result = run_cli("compare", record, "--reference", "pyscf", "--json")
    assert result.code == 0, result.err
    assert abs(json.loads(result.out)[0]["delta_e_tot"]) < 1e-8


def test_bench_on_an_open_shell_is_uhf_on_both_sides(run_cli, tmp_path):
    """bench once ran ROHF for PySCF and counted singly occupied orbitals as doubly occupied
    for dfmp2, so both sides agreed on a wrong number."""
    record = tmp_path / "bench.h5"
    result = run_cli("bench", molecule_path("hydroxyl"), "--frozen-core", "--json", "-o",
                     record)
    assert result.code == 0, result.err
    summary = json.loads(result.out)
    assert summary["reference"] == "uhf"
    assert summary["abs_delta_e_corr"] < 1e-8 and summary["abs_delta_e_scf"] < 1e-10
    reference = pyscf_dfump2("hydroxyl", 1, frozen=1)
    import h5py
    with h5py.File(record, "r") as h5:
        assert abs(h5["runs/dfmp2_e_corr"][0] - reference.e_corr) <= 1e-8
        assert h5.attrs["command"].startswith("dfmp2 bench ")
        assert "--frozen-core" in h5.attrs["command"]


def test_a_restricted_open_shell_reference_is_refused_by_the_mp2_stage():
    from dfmp2.mp2 import kernel as mp2
    from dfmp2.errors import InputError
    mf = scf.RHF(pyscf_molecule("hydroxyl", "sto-3g", spin=1))
    mf.verbose = 0
    mf.kernel()
    with pytest.raises(InputError, match="ROHF"):
        mp2.Orbitals(mf.mo_energy, mf.mo_coeff, mf.mo_occ).channels()


def test_an_open_shell_energy_is_converged_past_its_soft_modes(run_cli, tmp_path):
    """The MP2 energy carries the SCF's residual orbital gradient to first order: the CN
    radical in aug-cc-pVDZ stopped at 1e-7 with E_corr 4.9e-8 Eh from its converged value
    (README: stable to about 1e-9 Eh). Open shells now converge to 1e-8. The reference is
    PySCF's DF-UHF converged to 1e-9, then its DF-UMP2."""
    from pyscf import gto
    molecule = tmp_path / "cn.xyz"
    molecule.write_text("2\nCN radical\nC 0 0 0\nN 0 0 1.17\n")
    mol = gto.M(atom="C 0 0 0; N 0 0 1.17", basis="aug-cc-pvdz", spin=1, verbose=0)
    mf = scf.UHF(mol).density_fit(auxbasis="aug-cc-pvdz-jkfit")
    mf.conv_tol, mf.conv_tol_grad, mf.max_cycle = 1e-12, 1e-9, 200
    mf.kernel()
    assert mf.converged
    pt = dfump2.DFUMP2(mf)
    pt.with_df = df.DF(mol, auxbasis="aug-cc-pvdz-ri")
    pt.verbose = 0
    pt.kernel(with_t2=False)
    result = run_cli("run", molecule, "--spin", "1", "--basis", "aug-cc-pvdz", "--threads", "1",
                     "--backend", "torch", "--json", "-o", tmp_path / "cn.h5")
    assert result.code == 0, result.err
    assert abs(json.loads(result.out)["e_corr"] - pt.e_corr) <= 1e-8


def test_the_cn_radical_converges_on_our_engine(run_cli, tmp_path, caplog):
    """With DIIS keeping 12 Fock matrices the CN radical (cc-pVDZ, 1.172 Angstrom) stalled
    47 mEh above its minimum for 100 cycles and the run failed, where PySCF's DF-UHF with its
    8 converges (and with 12 stalls the same way): open shells keep PySCF's 8. Its UHF is
    heavily spin-contaminated (<S^2> 1.15 for a doublet): the run warns, records and reports
    it."""
    from pyscf import gto
    molecule = tmp_path / "cn.xyz"
    molecule.write_text("2\nCN radical\nC 0 0 0\nN 0 0 1.172\n")
    mol = gto.M(atom="C 0 0 0; N 0 0 1.172", basis="cc-pvdz", spin=1, verbose=0)
    mf = scf.UHF(mol).density_fit(auxbasis="cc-pvdz-jkfit")
    mf.conv_tol, mf.conv_tol_grad = 1e-12, 1e-8
    mf.kernel()
    assert mf.converged
    result = run_cli("run", molecule, "--spin", "1", "--basis", "cc-pvdz", "--threads", "1",
                     "--backend", "torch", "--json", "-o", tmp_path / "cn.h5")
    assert result.code == 0, result.err
    summary = json.loads(result.out)
    assert abs(summary["e_scf"] - mf.e_tot) <= 1e-9
    assert abs(summary["s2"] - mf.spin_square()[0]) <= 1e-6 and summary["s2"] > 1.1
    assert "the UHF reference is spin-contaminated: <S^2> = 1.15" in caplog.text
    shown = run_cli("show", tmp_path / "cn.h5")
    assert "Warning: the UHF reference is spin-contaminated (<S^2> 1.15" in shown.out


def test_a_wandering_scf_is_taken_to_a_minimum_by_the_second_order_solver(run_cli, tmp_path,
                                                                          caplog, monkeypatch):
    """The CN radical in 6-31G: DIIS wanders (PySCF's too: neither converges in 100 cycles,
    and they end 5 mEh apart) and the run failed. The second-order solver now takes the
    last orbitals into a minimum's basin and DIIS converges there, to the energy PySCF's
    second-order solver reaches from its guess, 40 mEh below either DIIS. Where DIIS ends
    follows the rounding (one summation order on one thread happened to converge on its
    100th cycle), so DIIS stops here at 40 cycles, where every order and thread count tried
    was still wandering."""
    from pyscf import gto
    monkeypatch.setattr(reference, "MAX_CYCLE", 40)
    mol = gto.M(atom="C 0 0 0; N 0 0 1.172", basis="6-31g", spin=1, verbose=0)
    newton = scf.UHF(mol).density_fit().newton()
    newton.conv_tol, newton.conv_tol_grad = 1e-12, 1e-7
    newton.kernel()
    assert newton.converged
    molecule = tmp_path / "cn.xyz"
    molecule.write_text("2\nCN radical\nC 0 0 0\nN 0 0 1.172\n")
    result = run_cli("run", molecule, "--spin", "1", "--basis", "6-31g", "--backend", "torch",
                     "--json", "-o", tmp_path / "cn.h5")
    assert result.code == 0, result.err
    summary = json.loads(result.out)
    assert summary["scf_converged"] and abs(summary["e_scf"] - newton.e_tot) <= 1e-9
    assert "going on with the second-order solver" in caplog.text
    assert summary["stability"] == "stable"


def test_every_run_records_the_spin_square_of_its_reference(tmp_path, caplog):
    """<S^2> of the stored reference is PySCF's of the same orbitals: 0 for a closed shell,
    0.7536 for hydroxyl's UHF, whose 0.0036 above S(S+1) is no contamination to warn of."""
    for name, spin in (("water", 0), ("hydroxyl", 1)):
        outcome = run(RunSettings(molecule=molecule_path(name), backend="torch",
                                  output=tmp_path / f"{name}.h5", show_progress=False))
        group = outcome.record.groups["scf"]
        mol = pyscf_molecule(name, "cc-pvdz", spin=spin)
        occupations, coefficients = group.datasets["mo_occ"], group.datasets["mo_coeff"]
        if spin:
            occupied = [coefficients[n][:, occupations[n] > 0] for n in range(2)]
            expected = scf.uhf.spin_square(occupied, mol.intor("int1e_ovlp"))[0]
            assert 0.7501 < expected < 0.76
        else:
            expected = 0.0
        assert group.attrs["s2"] == pytest.approx(expected, abs=1e-12)
    assert "spin-contaminated" not in caplog.text


def test_the_reference_of_an_older_record_gets_its_spin_square_when_resumed(tmp_path,
                                                                           run_cli):
    """A record written before <S^2> was recorded (no ``s2``): the run resuming from its
    orbitals computes it, and its report leaves it out meanwhile."""
    record = tmp_path / "oh.h5"
    outcome = run(RunSettings(molecule=molecule_path("hydroxyl"), backend="torch",
                              output=record, show_progress=False))
    section, orbitals = read_scf(outcome.record)
    with h5py.File(record, "r+") as h5:
        del h5["scf"].attrs["s2"]
    shown = run_cli("show", record)
    assert shown.code == 0, shown.err
    assert "E(SCF)" in shown.out
    assert "<S^2>" not in shown.out
    calc = define_calculation(read_xyz(molecule_path("hydroxyl")), CalculationRequest())
    older = dataclasses.replace(section, s2=float("nan"))
    restored = restored_scf(calc, older, orbitals, ScfOptions("pyscf"))
    assert restored.section.s2 == section.s2 > 0.75

