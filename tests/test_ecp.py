"""Effective core potentials: bases that carry them use them by default, as PySCF does with
``ecp=basis``; the frozen core honours them; the record says which; --ecp overrides."""
from __future__ import annotations

import json
from pathlib import Path

import h5py
import pytest
from pyscf import df, gto, scf
from pyscf.data import elements
from pyscf.mp import dfmp2 as pyscf_dfmp2

from conftest import molecule_path

HOSTILE = Path(__file__).resolve().parent / "hostile"
METHYL_IODIDE = HOSTILE / "methyl_iodide.xyz"


def pyscf_ch3i(basis: str, ecp: str | None):
    lines = METHYL_IODIDE.read_text().splitlines()
    mol = gto.M(atom="\n".join(lines[2:]), basis=basis, ecp=ecp, verbose=0)
    mf = scf.RHF(mol).density_fit()
    mf.conv_tol, mf.conv_tol_grad, mf.verbose = 1e-12, 1e-7, 0
    mf.kernel()
    assert mf.converged
    pt = pyscf_dfmp2.DFMP2(mf, frozen=elements.chemcore(mol))
    pt.with_df = df.DF(mol, auxbasis=df.make_auxbasis(mol, mp2fit=True))
    pt.verbose = 0
    pt.kernel(with_t2=False)
    return mf, pt


def test_def2_basis_brings_its_core_potential(run_cli, tmp_path):
    mf, pt = pyscf_ch3i("def2-svp", "def2-svp")
    record = tmp_path / "ch3i.h5"
    result = run_cli("run", METHYL_IODIDE, "--basis", "def2-svp", "--frozen-core", "--check",
                     "--backend", "torch", "--json", "-o", record)
    assert result.code == 0, result.err
    summary = json.loads(result.out)
    assert abs(summary["e_scf"] - mf.e_tot) <= 1e-9
    assert summary["e_scf"] == pytest.approx(-336.23, abs=0.01)
    assert abs(summary["e_corr"] - pt.e_corr) <= 1e-8
    assert summary["check_passed"]
    with h5py.File(record, "r") as h5:
        assert json.loads(h5["input"].attrs["ecp"]) == {"I": "def2-svp"}
        assert h5["input"].attrs["frozen"] == 5
        assert "even-tempered" in h5["input"].attrs["auxbasis"]
        assert len(h5["input"].attrs["auxbasis"]) < 80


@pytest.mark.parametrize("basis,potentials", [("ccecp-cc-pVDZ", "ccecp"),
                                               ("bfd-vdz", "bfdpp")])
def test_a_basis_made_for_the_librarys_separate_potentials_gets_them(basis, potentials,
                                                                      run_cli, tmp_path,
                                                                      caplog):
    """PySCF keeps the ccECP and BFD potentials apart from their valence bases: without
    them water ran all-electron in a basis with no core functions (E(SCF) -34.7 Eh), status
    0 and no warning."""
    water = molecule_path("water")
    mol = gto.M(atom="\n".join(water.read_text().splitlines()[2:]), basis=basis,
                ecp=potentials, verbose=0)
    mf = scf.RHF(mol).density_fit()
    mf.conv_tol, mf.conv_tol_grad, mf.verbose = 1e-12, 1e-7, 0
    mf.kernel()
    pt = pyscf_dfmp2.DFMP2(mf)
    pt.with_df = df.DF(mol, auxbasis=df.make_auxbasis(mol, mp2fit=True))
    pt.verbose = 0
    pt.kernel(with_t2=False)
    for ecp in ((), ("--ecp", potentials)):
        record = tmp_path / f"w{len(ecp)}.h5"
        result = run_cli("run", water, "--basis", basis, *ecp, "--json", "-o", record)
        assert result.code == 0, result.err
        summary = json.loads(result.out)
        assert abs(summary["e_scf"] - mf.e_tot) <= 1e-9
        assert summary["e_scf"] == pytest.approx(-17.0, abs=0.1)
        assert abs(summary["e_corr"] - pt.e_corr) <= 1e-8
        with h5py.File(record, "r") as h5:
            assert json.loads(h5["input"].attrs["ecp"]) == {"H": potentials, "O": potentials}
    # Naming the set the basis is made for is no mismatch to warn about.
    assert not any(r.levelname == "WARNING" for r in caplog.records)
    result = run_cli("run", water, "--basis", basis, "--ecp", "none", "--json", "-o",
                     tmp_path / "ae.h5")
    assert result.code == 0 and json.loads(result.out)["e_scf"] < -30
    assert any("all-electron" in r.getMessage() for r in caplog.records)


def test_ecp_none_runs_all_electron_with_a_warning(run_cli, tmp_path, caplog):
    result = run_cli("run", METHYL_IODIDE, "--basis", "def2-svp", "--ecp", "none",
                     "--frozen-core", "--backend", "torch", "--json", "-o", tmp_path / "ae.h5")
    assert result.code == 0, result.err
    assert any("all-electron" in r.getMessage() and r.levelname == "WARNING"
               for r in caplog.records)
    summary = json.loads(result.out)
    assert summary["e_scf"] < -2000
    with h5py.File(tmp_path / "ae.h5", "r") as h5:
        assert json.loads(h5["input"].attrs["ecp"]) == {}
        assert h5["input"].attrs["frozen"] == 19


@pytest.mark.parametrize("args,fragment", [
    (("--ecp", "cc-pvdz"), "has no core potential for any of"),
    # It said 'no-such-set' "has no core potential for any of C, H, I", as if it existed.
    (("--ecp", "no-such-set"), "unknown ECP 'no-such-set': neither a PySCF library name"),
    (("--ecp", ""), "--ecp needs a name"),
])
def test_bad_ecp_is_refused(args, fragment, run_cli, tmp_path):
    result = run_cli("run", METHYL_IODIDE, "--basis", "def2-svp", *args, "--backend", "torch",
                     "-o", tmp_path / "x.h5")
    assert result.code == 2
    assert result.err.startswith("Error:") and fragment in result.err
    assert len(result.err.strip().splitlines()) == 1


@pytest.mark.parametrize("basis,ecp,missing", [("def2-svp", "none", 56),
                                               ("lanl2dz", "def2-svp", 36)])
def test_electrons_that_do_not_fit_for_want_of_the_bases_potentials_say_so(
        basis, ecp, missing, run_cli, tmp_path):
    # It said "check --charge and --spin", which were right.
    iodine = tmp_path / "i2.xyz"
    iodine.write_text("2\n\nI 0 0 0\nI 0 0 2.67\n")
    result = run_cli("run", iodine, "--basis", basis, "--ecp", ecp, "-o", tmp_path / "x.h5")
    assert result.code == 2
    line = result.err.strip().splitlines()[-1]
    assert line.startswith("Error:") and "do not fit" in line
    assert f"{basis} is made for core potentials that replace {missing} more electrons" in line
    assert "--charge" not in line


def test_explicit_ecp_name_on_another_basis(run_cli, tmp_path):
    """An ECP set named by --ecp applies to the elements it covers (here lanl2dz on iodine
    with the def2-svp basis): the same molecule PySCF builds with ecp={'I': 'lanl2dz'}."""
    lines = METHYL_IODIDE.read_text().splitlines()
    mol = gto.M(atom="\n".join(lines[2:]), basis="def2-svp", ecp={"I": "lanl2dz"}, verbose=0)
    mf = scf.RHF(mol).density_fit()
    mf.conv_tol, mf.conv_tol_grad, mf.verbose = 1e-12, 1e-7, 0
    mf.kernel()
    result = run_cli("run", METHYL_IODIDE, "--basis", "def2-svp", "--ecp", "lanl2dz",
                     "--backend", "torch", "--json", "-o", tmp_path / "l.h5")
    assert result.code == 0, result.err
    assert abs(json.loads(result.out)["e_scf"] - mf.e_tot) <= 1e-9


def test_explicit_ecp_on_an_all_electron_basis_warns(caplog):
    """--ecp lanl2dz with def2-SVP on ICl: iodine's def2-SVP is made for a core potential,
    chlorine's is all-electron, so LANL2DZ's potential on chlorine leaves its core functions
    as low virtuals (E(SCF) -25.6 Eh instead of about -756): said in a warning naming Cl."""
    from dfmp2.input.molecule import resolve_ecp

    assert resolve_ecp("def2-svp", "lanl2dz", ("I", "Cl")) == {"I": "lanl2dz",
                                                               "Cl": "lanl2dz"}
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    # Iodine's LANL2DZ potential takes 46 electrons where def2-SVP's functions are made
    # for 28: its 4s4p4d functions stay, as low virtuals, too.
    assert len(warnings) == 2 and "Cl gets a core potential" in warnings[0]
    assert "I," not in warnings[0]
    assert "I gets another core potential than the one def2-svp is made for" in warnings[1]
    caplog.clear()
    assert resolve_ecp("def2-svp", "lanl2dz", ("I", "C", "H")) == {"I": "lanl2dz"}
    assert len([r for r in caplog.records if r.levelname == "WARNING"]) == 1
    caplog.clear()
    assert resolve_ecp("def2-svp", None, ("I", "Cl")) == {"I": "def2-svp"}
    # The same potentials under another name (def2-TZVP's are def2-SVP's) are no mismatch.
    assert resolve_ecp("def2-svp", "def2-tzvp", ("I", "H")) == {"I": "def2-tzvp"}
    assert not [r for r in caplog.records if r.levelname == "WARNING"]
    # A basis made for the library's separate potentials: def2-SVP's on HI in ccECP-cc-pVDZ
    # ran without a word (iodine's 28 core electrons where the basis is made for 46, and
    # hydrogen's ccECP left out).
    assert resolve_ecp("ccecp-cc-pvdz", "def2-svp", ("H", "I")) == {"I": "def2-svp"}
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len(warnings) == 2
    assert "I gets another core potential than the one ccecp-cc-pvdz is made for" in warnings[0]
    assert "H runs all-electron in ccecp-cc-pvdz, a basis made for core potentials" in warnings[1]


def test_a_basis_file_brings_its_core_potentials(run_cli, tmp_path, monkeypatch):
    """A basis file that carries ECP blocks (PySCF's own def2-SVP file here, as the Basis Set
    Exchange writes them) uses them, as a library basis does: ignored, iodine ran with 53
    electrons in a basis made for 25 (E(SCF) -1996.9 instead of -297.2 Eh). --ecp FILE takes
    them from a file too; the record keeps the file's digest."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "mine.nw").write_bytes(
        (Path(gto.basis.__file__).parent / "def2-svp.dat").read_bytes())
    (tmp_path / "hi.xyz").write_text("2\nhydrogen iodide\nH 0 0 0\nI 0 0 1.609\n")
    mol = gto.M(atom="H 0 0 0; I 0 0 1.609", basis="./mine.nw", ecp="./mine.nw", verbose=0)
    mf = scf.RHF(mol).density_fit(auxbasis="def2-universal-jkfit")
    mf.conv_tol, mf.conv_tol_grad, mf.verbose = 1e-12, 1e-7, 0
    reference = mf.kernel()
    fits = ("--jk-auxbasis", "def2-universal-jkfit", "--backend",
            "torch", "--json")
    for name, args in (("file.h5", ("--basis", "./mine.nw")),
                       ("ecp.h5", ("--basis", "def2-svp", "--ecp", "./mine.nw"))):
        result = run_cli("run", "hi.xyz", *args, *fits, "-o", name)
        assert result.code == 0, result.err
        assert abs(json.loads(result.out)["e_scf"] - reference) <= 1e-9
        with h5py.File(name, "r") as h5:
            assert json.loads(h5["input"].attrs["ecp"]) == {"I": "./mine.nw"}
            assert h5["input"].attrs["ecp_file"].startswith("sha256:")


def test_an_ecp_file_that_starts_with_its_ecp_line(run_cli, tmp_path, monkeypatch):
    """PySCF finds NWChem's ECP blocks only after a line break: a file of ECP blocks alone,
    'ECP' on its first line, was refused as having no potential for any element. The
    refusal now says why and how to fix the file; fixed so, it runs as the library's."""
    monkeypatch.chdir(tmp_path)
    library = (Path(gto.basis.__file__).parent / "def2-svp.dat").read_text().splitlines()
    start = next(i for i, line in enumerate(library) if line.strip() == "ECP")
    blocks = "\n".join(library[start:]) + "\n"
    (tmp_path / "first.nw").write_text(blocks)
    (tmp_path / "second.nw").write_text("# iodine's potential\n" + blocks)
    (tmp_path / "hi.xyz").write_text("2\nhydrogen iodide\nH 0 0 0\nI 0 0 1.609\n")
    common = ("hi.xyz", "--basis", "def2-svp", "--backend", "torch", "--json")
    refused = run_cli("run", *common, "--ecp", "./first.nw", "-o", "first.h5")
    assert refused.code == 2
    assert "starts with its ECP line" in refused.err and "comment line" in refused.err
    assert len(refused.err.strip().splitlines()) == 1
    fixed = run_cli("run", *common, "--ecp", "./second.nw", "-o", "second.h5")
    library_run = run_cli("run", *common, "-o", "library.h5")
    assert fixed.code == 0 and library_run.code == 0, fixed.err + library_run.err
    assert abs(json.loads(fixed.out)["e_tot"] - json.loads(library_run.out)["e_tot"]) <= 1e-10


@pytest.mark.parametrize("basis", ["unc-def2-svp", "def2-svp@5s4p2d"])
def test_a_reshaped_basis_keeps_the_core_potentials_it_is_made_for(basis, run_cli, tmp_path):
    """PySCF reads 'unc-def2-svp' as def2-SVP's functions uncontracted and 'def2-svp@5s4p2d'
    as them contracted anew, both made for def2-SVP's core potentials (its own
    ecp='unc-def2-svp' cannot be parsed): xenon ran all-electron on valence functions,
    E(SCF) -7055.0 Eh instead of about -328.3, status 0 and no warning."""
    xenon = tmp_path / "xe.xyz"
    xenon.write_text("1\nxenon\nXe 0 0 0\n")
    mol = gto.M(atom="Xe 0 0 0", basis=basis, ecp="def2-svp", verbose=0)
    mf = scf.RHF(mol).density_fit()
    mf.conv_tol, mf.conv_tol_grad, mf.verbose = 1e-12, 1e-7, 0
    mf.kernel()
    pt = pyscf_dfmp2.DFMP2(mf, frozen=elements.chemcore(mol))
    pt.with_df = df.DF(mol, auxbasis=df.make_auxbasis(mol, mp2fit=True))
    pt.verbose = 0
    pt.kernel(with_t2=False)
    record = tmp_path / "xe.h5"
    result = run_cli("run", xenon, "--basis", basis, "--frozen-core", "--threads", "1",
                     "--json", "-o", record)
    assert result.code == 0, result.err
    summary = json.loads(result.out)
    assert abs(summary["e_scf"] - mf.e_tot) <= 1e-9 and summary["e_scf"] > -400
    assert abs(summary["e_corr"] - pt.e_corr) <= 1e-8
    with h5py.File(record, "r") as h5:
        assert json.loads(h5["input"].attrs["ecp"]) == {"Xe": "def2-svp"}
        assert h5["input"].attrs["frozen"] == elements.chemcore(mol) == 4
