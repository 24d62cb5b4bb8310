"""Basis choices dfmp2 runs but warns of, and basis names it must read as PySCF does."""
from __future__ import annotations

import json
import shutil

import h5py
import pytest
from pyscf import df, gto, scf
from pyscf.mp import dfmp2

from conftest import molecule_path, pyscf_df_rhf, pyscf_dfmp2_reference
from dfmp2.input.basis_kinds import (F12_CABS, J_FIT, JK_FIT, ORBITAL, RI_FIT, fitting_mismatch,
                                     library_kind, relativistic_contraction,
                                     relativistic_mismatch)

# Water's 3-21G with a d shell on oxygen, in NWChem's format as the Basis Set Exchange writes
# it (PySCF's reader finds an element's shells after a '#BASIS SET' line).
WATER_321G_D_NWCHEM = """BASIS "ao basis" PRINT
#BASIS SET: (3s) -> [2s]
H    S
      5.4471780              0.1562850
      0.8245470              0.9046910
H    S
      0.1831920              1.0000000
#BASIS SET: (6s,3p,1d) -> [3s,2p,1d]
O    S
    322.0370000              0.0592394
     48.4308000              0.3515000
     10.4206000              0.7076580
O    SP
      7.4029400             -0.4044530              0.2445860
      1.5762000              1.2215600              0.8539550
O    SP
      0.3736840              1.0000000              1.0000000
O    D
      0.8000000              1.0000000
END
"""


def test_a_file_named_like_a_pople_basis_pyscf_cannot_compose_is_read(run_cli, tmp_path,
                                                                        monkeypatch):
    """PySCF has no polarisation files for 3-21G, so a file named 3-21G(d) is the only basis
    of that name: it was refused as a library basis the file would shadow."""
    monkeypatch.chdir(tmp_path)
    shutil.copy(molecule_path("water"), "water.xyz")
    (tmp_path / "3-21G(d)").write_text(WATER_321G_D_NWCHEM)
    result = run_cli("run", "water.xyz", "--basis", "3-21G(d)", "--threads", "1", "--json",
                     "-o", "w.h5")
    assert result.code == 0, result.err
    summary = json.loads(result.out)
    # PySCF reads the file of that name here, as dfmp2 does.
    mol = gto.M(atom="\n".join(molecule_path("water").read_text().splitlines()[2:]),
                basis="3-21G(d)", verbose=0)
    assert mol.nao == 2 * 2 + 9 + 5
    mf = pyscf_df_rhf(mol)
    assert abs(summary["e_scf"] - mf.e_tot) <= 1e-9
    assert abs(summary["e_corr"] - pyscf_dfmp2_reference(mf, 0).e_corr) <= 1e-8
    # A file that holds no water functions is refused for what it lacks, not for its name.
    (tmp_path / "3-21G(d)").write_text("notes\n")
    result = run_cli("run", "water.xyz", "--basis", "3-21G(d)", "-o", "n.h5")
    assert result.code == 2
    assert result.err.strip() == ("Error: --basis file '3-21G(d)' has no functions for O, H; "
                                  "add them to it, or choose a basis that covers every element")


def _water(basis: str) -> gto.Mole:
    return gto.M(atom="\n".join(molecule_path("water").read_text().splitlines()[2:]),
                 basis=basis, verbose=0)


def _warnings(caplog) -> list[str]:
    """The warnings logged, which the command line prints on stderr."""
    return [record.getMessage() for record in caplog.records if record.levelname == "WARNING"]


ORBITAL_AS_JK = ("--jk-auxbasis cc-pvdz is an orbital basis, not a JK-fit set, so E(SCF) can "
                 "be far off; leave --jk-auxbasis out for the default, cc-pvdz-jkfit")


@pytest.mark.parametrize("option,name,warning", [
    ("--jk-auxbasis", "cc-pvdz", ORBITAL_AS_JK),
    ("--auxbasis", "cc-pvdz", "--auxbasis cc-pvdz is an orbital basis, not an MP2-fit (RI) "
     "set, so E_corr can be far off; leave --auxbasis out for the default, cc-pvdz-ri"),
    ("--jk-auxbasis", "cc-pvdz-ri", "--jk-auxbasis cc-pvdz-ri is an MP2-fit (RI) set, not a "
     "JK-fit set, so E(SCF) is fitted less accurately; leave --jk-auxbasis out for the "
     "default, cc-pvdz-jkfit"),
    ("--auxbasis", "def2-universal-jkfit", "--auxbasis def2-universal-jkfit is a JK-fit set, "
     "not an MP2-fit (RI) set, so E_corr is fitted less accurately; leave --auxbasis out for "
     "the default, cc-pvdz-ri"),
    ("--jk-auxbasis", "weigend", "--jk-auxbasis weigend is a Coulomb-fit (J) set for DFT, not "
     "a JK-fit set, so E(SCF) is fitted less accurately; leave --jk-auxbasis out for the "
     "default, cc-pvdz-jkfit")])
def test_a_fitting_set_of_another_kind_runs_with_a_warning(option, name, warning, run_cli,
                                                            tmp_path, single_thread, caplog):
    """It ran without a word: an orbital basis as the JK-fit set put water's E(SCF) 0.245 Eh
    low. The energies stay PySCF's for the sets given."""
    record = tmp_path / "w.h5"
    result = run_cli("run", molecule_path("water"), option, name, "--threads", "1", "--json",
                     "-o", record)
    assert result.code == 0, result.err
    assert _warnings(caplog) == [warning]
    summary = json.loads(result.out)
    assert summary["basis_warnings"] == [warning]
    mol = _water("cc-pvdz")
    jk = name if option == "--jk-auxbasis" else df.make_auxbasis(mol)
    mf = scf.RHF(mol).density_fit(auxbasis=jk)
    mf.conv_tol, mf.conv_tol_grad, mf.verbose = 1e-12, 1e-7, 0
    mf.kernel()
    assert abs(summary["e_scf"] - mf.e_tot) <= 1e-9
    pt = dfmp2.DFMP2(mf)
    pt.with_df = df.DF(mol, auxbasis=name if option == "--auxbasis"
                       else df.make_auxbasis(mol, mp2fit=True))
    pt.verbose = 0
    pt.kernel(with_t2=False)
    assert abs(summary["e_corr"] - pt.e_corr) <= 1e-8
    if warning == ORBITAL_AS_JK:
        assert summary["e_scf"] < pyscf_df_rhf(mol).e_tot - 0.2
    shown = run_cli("show", record)
    assert f"  Warning: {warning}" in shown.out.splitlines()
    with h5py.File(record, "r") as h5:
        assert json.loads(h5["input"].attrs["basis_warnings"]) == [warning]


@pytest.mark.parametrize("args", [(), ("--jk-auxbasis", "cc-pvdz-jkfit"),
                                  ("--jk-auxbasis", "def2-universal-jkfit"),
                                  ("--auxbasis", "cc-pvdz-ri"), ("--auxbasis", "def2-svp-ri")])
def test_the_default_partners_and_fitting_sets_of_the_right_kind_run_without_one(
        args, run_cli, tmp_path, single_thread, caplog):
    result = run_cli("run", molecule_path("water"), *args, "--threads", "1", "--json",
                     "-o", tmp_path / "w.h5")
    assert result.code == 0, result.err
    assert _warnings(caplog) == []
    assert json.loads(result.out)["basis_warnings"] == []


def test_the_librarys_fitting_sets_are_told_apart_by_kind(tmp_path):
    """Every partner PySCF pairs with an orbital basis is of its option's kind (so a default
    never warns); other names as their files say; a file given by path is the user's."""
    for jk, ri in df.addons.DEFAULT_AUXBASIS.values():
        assert (library_kind(jk), library_kind(ri)) == (JK_FIT, RI_FIT), (jk, ri)
    assert {name: library_kind(name) for name in (
        "weigend", "def2-universal-jfit", "ahlrichs", "cc-pvdz_fit", "cc-pV5Z-MP2FIT",
        "cc-pvdz-f12-optri", "6-31G(d,p)", "sto-3g", "no-such-basis")} == {
        "weigend": J_FIT, "def2-universal-jfit": J_FIT, "ahlrichs": J_FIT,
        "cc-pvdz_fit": RI_FIT, "cc-pV5Z-MP2FIT": RI_FIT, "cc-pvdz-f12-optri": F12_CABS,
        "6-31G(d,p)": ORBITAL, "sto-3g": ORBITAL, "no-such-basis": None}
    path = tmp_path / "cc-pvdz"
    path.write_text(WATER_321G_D_NWCHEM)
    assert library_kind(str(path)) is None
    assert fitting_mismatch("--auxbasis", str(path), True, lambda: "cc-pvdz-ri") is None


@pytest.mark.parametrize("name,kind", [("cc-pvdz-jkfit", "a JK-fit set"),
                                       ("weigend", "a Coulomb-fit (J) set for DFT")])
def test_a_fitting_set_as_the_orbital_basis_runs_with_a_warning(name, kind, run_cli, tmp_path,
                                                                single_thread, caplog):
    """It ran without a word; the energies stay PySCF's for the basis given."""
    result = run_cli("run", molecule_path("water"), "--basis", name, "--threads", "1", "--json",
                     "-o", tmp_path / "w.h5")
    assert result.code == 0, result.err
    warning = (f"--basis {name} is {kind}, not an orbital basis, so these energies are of no "
               "orbital basis; choose one such as cc-pvdz, and the fitting sets with --auxbasis "
               "and --jk-auxbasis")
    assert _warnings(caplog) == [warning]
    summary = json.loads(result.out)
    assert summary["basis_warnings"] == [warning]
    mol = _water(name)
    assert abs(summary["e_scf"] - pyscf_df_rhf(mol).e_tot) <= 1e-9


def test_a_warning_is_said_once_for_all_of_a_jobs_calculations(run_cli, tmp_path,
                                                               single_thread, caplog):
    """An interaction job defines five calculations in one basis: each said it again."""
    record = tmp_path / "wd.h5"
    result = run_cli("interaction", molecule_path("water_dimer"), "--split", "3", "--basis",
                     "sto-3g", "--jk-auxbasis", "sto-3g", "--threads", "1", "-o", record)
    assert result.code == 0, result.err
    warning = ("--jk-auxbasis sto-3g is an orbital basis, not a JK-fit set, so E(SCF) can be "
               "far off; leave --jk-auxbasis out for the default, def2-svp-jkfit")
    assert _warnings(caplog) == [warning]
    assert result.out.count(f"Warning: {warning}") == 1
    with h5py.File(record, "r") as h5:
        for name in ("dimer", "monomer_a_cp", "monomer_b_cp", "monomer_a", "monomer_b"):
            assert json.loads(h5[name]["input"].attrs["basis_warnings"]) == [warning]


def test_a_relativistically_contracted_basis_runs_with_a_warning(run_cli, tmp_path,
                                                                  single_thread, caplog):
    """dfmp2 has no scalar-relativistic Hamiltonian: cc-pVDZ-DK ran without a note. The
    energies are PySCF's non-relativistic ones in that basis."""
    record = tmp_path / "w.h5"
    result = run_cli("run", molecule_path("water"), "--basis", "cc-pVDZ-DK", "--threads", "1",
                     "--json", "-o", record)
    assert result.code == 0, result.err
    warning = ("--basis cc-pVDZ-DK is contracted for a scalar-relativistic (Douglas-Kroll-Hess) "
               "Hamiltonian, but dfmp2 uses the non-relativistic one, so these energies are of "
               "that mismatched pair (poor for heavy elements); use cc-pVDZ for a "
               "non-relativistic calculation")
    assert _warnings(caplog) == [warning]
    summary = json.loads(result.out)
    assert summary["basis_warnings"] == [warning]
    mf = pyscf_df_rhf(_water("cc-pVDZ-DK"))
    assert abs(summary["e_scf"] - mf.e_tot) <= 1e-9
    assert abs(summary["e_corr"] - pyscf_dfmp2_reference(mf, 0).e_corr) <= 1e-8
    # Another contraction of cc-pVDZ's primitives: not the non-relativistic basis's energy.
    assert abs(summary["e_scf"] - pyscf_df_rhf(_water("cc-pvdz")).e_tot) > 1e-4
    assert f"  Warning: {warning}" in run_cli("show", record).out.splitlines()
    # An altered record's warnings are refused in one line, not a JSON traceback.
    with h5py.File(record, "r+") as h5:
        h5["input"].attrs["basis_warnings"] = "[1"
    shown = run_cli("show", record)
    assert shown.code == 2 and shown.err.strip() == (
        "Error: the record's /input basis_warnings holds [1, not the list of warnings dfmp2 "
        "writes; it was not written by this version of dfmp2, or was altered")


def test_the_librarys_relativistic_contractions_are_known(tmp_path):
    for name in ("cc-pvdz-dk", "cc-pVTZ-DK3", "aug-cc-pwCVTZ-DK", "ano-rcc", "ano", "sarc-dkh",
                 "dzp-dkh"):
        assert relativistic_contraction(name), name
    for name in ("cc-pvdz", "def2-svp", "cc-pvdz-pp", "ano-roos-dz", "dyall-v2z",
                 "no-such-basis"):
        assert not relativistic_contraction(name), name
    # Dyall's sets are made for the Dirac Hamiltonian, but PySCF has them uncontracted: no
    # contraction for the non-relativistic one to mismatch.
    dyall, dk = _water("dyall-v2z"), _water("cc-pvdz-dk")
    assert dyall.npgto_nr() == dyall.nao_nr() and dk.npgto_nr() > dk.nao_nr()
    # ANO-RCC has no non-relativistic contraction of its name to offer.
    assert relativistic_mismatch("ano-rcc").endswith(
        "; choose a non-relativistic basis (cc-pvdz; def2-svp with its core potentials for "
        "heavy elements)")
    path = tmp_path / "cc-pvdz-dk"
    path.write_text(WATER_321G_D_NWCHEM)
    assert relativistic_mismatch(str(path)) is None
