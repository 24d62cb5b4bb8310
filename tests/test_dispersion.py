"""Dispersion of double hybrids (dftd3, dftd4) and the SCF's --jk-auxbasis: the total against
PySCF's recipe plus the library's energy computed here, the dispersion against the library, the
published parameters against the libraries' tables, the record, batch reuse and the errors."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import h5py
import numpy as np
import pytest
from dftd3.interface import DispersionModel as D3Model
from dftd3.interface import RationalDampingParam, ZeroDampingParam
from dftd4.interface import DampingParam
from dftd4.interface import DispersionModel as D4Model
from pyscf import gto, scf

from conftest import molecule_path, pyscf_molecule
from test_double_hybrid import pyscf_double_hybrid
from dfmp2.input.dispersion import Dispersion, dispersion_energy
from dfmp2.input.settings import RunSettings
from dfmp2.jobs import run as run_job
from dfmp2.records.report import json_summary

# From the papers, not from dfmp2: the mix, the MP2 scales and the damping parameters.
B2PLYP = ("0.53*HF + 0.47*B88, 0.73*LYP", 0.27, 0.27)
REVDSD_PBEP86_D4 = ("0.69*HF + 0.31*PBE, 0.4210*P86", 0.5922, 0.0636)
JK_FIT = "def2-universal-jkfit"


def _real(mol: gto.Mole) -> tuple[np.ndarray, np.ndarray]:
    return np.array([gto.charge(mol.atom_symbol(n)) for n in range(mol.natm)]), mol.atom_coords()


def library_d3bj(mol: gto.Mole, method: str) -> float:
    numbers, positions = _real(mol)
    return float(D3Model(numbers, positions).get_dispersion(
        RationalDampingParam(method=method), grad=False)["energy"])


def library_d4(mol: gto.Mole, method: str) -> float:
    numbers, positions = _real(mol)
    return float(D4Model(numbers, positions, charge=mol.charge).get_dispersion(
        DampingParam(method=method), grad=False)["energy"])


def run(path: Path, tmp_path: Path, **options) -> dict:
    settings = RunSettings(molecule=path, output=tmp_path / f"{path.stem}.h5",
                           show_progress=False, **options)
    outcome = run_job.run(settings)
    return json_summary(outcome.record, str(outcome.path))


def test_b2plyp_d3bj_matches_pyscf_recipe_plus_dftd3(tmp_path):
    ours = run(molecule_path("water"), tmp_path, basis="6-31g", xc="B2PLYP-D3BJ", grid=1)
    mol = pyscf_molecule("water", "6-31g")
    e_ks, e_dh = pyscf_double_hybrid(mol, *B2PLYP, grid_level=1)
    e_disp = library_d3bj(mol, "b2plyp")
    assert abs(ours["e_scf"] - e_ks) <= 1e-8
    assert abs(ours["e_tot"] - (e_dh + e_disp)) <= 1e-8
    assert ours["e_disp"] == pytest.approx(e_disp, abs=1e-12) and e_disp < -1e-5
    assert ours["e_tot"] == pytest.approx(ours["e_scf"] + ours["e_pt2"] + ours["e_disp"],
                                          abs=1e-12)


def test_open_shell_revdsd_d4_with_jk_auxbasis_matches_recipe(run_cli, tmp_path):
    """CH3 doublet: UKS with revDSD-PBEP86's mix and the JK-fit basis given, DF-UMP2 scaled,
    plus dftd4's D4; --check runs PySCF's recipe with the same JK basis and dispersion."""
    record = tmp_path / "ch3.h5"
    result = run_cli("run", molecule_path("methyl"), "--basis", "6-31g", "--xc",
                     "revdsd-pbep86-d4", "--grid", "1", "--jk-auxbasis", JK_FIT, "--check",
                     "--json", "-o", record)
    assert result.code == 0, result.err
    ours = json.loads(result.out)
    mol = pyscf_molecule("methyl", "6-31g", spin=1)
    e_ks, e_dh = pyscf_double_hybrid(mol, *REVDSD_PBEP86_D4, grid_level=1,
                                      jk_auxbasis=JK_FIT)
    e_disp = library_d4(mol, "revdsdpbep86")
    assert abs(ours["e_scf"] - e_ks) <= 1e-8
    assert abs(ours["e_tot"] - (e_dh + e_disp)) <= 1e-8
    assert ours["check_passed"] and abs(ours["reference_e_tot"] - (e_dh + e_disp)) <= 1e-8
    with h5py.File(record, "r") as h5:
        section = h5["double_hybrid"].attrs
        assert section["e_disp"] == pytest.approx(e_disp, abs=1e-12)
        assert section["dispersion"].startswith("D4 (dftd4 ")
        assert "Santra" in section["source"] and h5["scf"].attrs["reference"] == "uks"
        assert h5["input"].attrs["dispersion"] == "d4"
        assert h5["input"].attrs["jk_auxbasis"] == JK_FIT


@pytest.mark.parametrize("model, method", [("d3bj", "b2plyp"), ("d3zero", "b2plyp"),
                                           ("d4", "b2plyp")])
def test_dispersion_energy_is_the_librarys(model, method):
    """Methane's own dispersion, ghost atoms (a second methane) left out, and D4's charge."""
    mol = pyscf_molecule("methane", "sto-3g")
    ours = dispersion_energy(Dispersion(model, method), mol)
    numbers, positions = _real(mol)
    if model == "d4":
        library = D4Model(numbers, positions, charge=0).get_dispersion(
            DampingParam(method=method), grad=False)["energy"]
    else:
        param = (RationalDampingParam if model == "d3bj" else ZeroDampingParam)(method=method)
        library = D3Model(numbers, positions).get_dispersion(param, grad=False)["energy"]
    assert ours == pytest.approx(float(library), abs=1e-12) and ours < -1e-6
    ghost_copy = [(f"ghost-{symbol}", (x, y, z + 6.0)) for symbol, (x, y, z) in mol._atom]
    pair = gto.M(atom=[*mol._atom, *ghost_copy], unit="Bohr", basis="sto-3g", verbose=0)
    ghosts = frozenset(range(mol.natm, 2 * mol.natm))
    assert dispersion_energy(Dispersion(model, method), pair, ghosts) == pytest.approx(
        ours, abs=1e-12)


def test_d4_takes_the_charge():
    cation = pyscf_molecule("water", "sto-3g", charge=1, spin=1)
    ours = dispersion_energy(Dispersion("d4", "b2plyp"), cation)
    assert ours == pytest.approx(library_d4(cation, "b2plyp"), abs=1e-12)
    assert ours != pytest.approx(library_d4(pyscf_molecule("water", "sto-3g"), "b2plyp"),
                                 abs=1e-9)


@pytest.mark.parametrize("model, method, published", [
    # Goerigk, Grimme, Phys. Chem. Chem. Phys. 13, 6670 (2011).
    ("d3bj", "b2plyp", {"s6": 0.64, "a1": 0.3065, "s8": 0.9147, "a2": 5.0570}),
    ("d3bj", "b2gpplyp", {"s6": 0.56, "a1": 0.0, "s8": 0.2597, "a2": 6.3332}),
    # Kozuch, Martin, J. Comput. Chem. 34, 2327 (2013): DSD-PBEP86-D3BJ.
    ("d3bj", "dsdpbep86", {"s6": 0.48, "a1": 0.0, "s8": 0.0, "a2": 5.6}),
    # Santra, Sylvetsky, Martin, J. Phys. Chem. A 123, 5129 (2019): revDSD-PBEP86-D4.
    ("d4", "revdsdpbep86", {"s6": 0.5132, "a1": 0.44, "s8": 0.0, "a2": 3.60}),
])
def test_named_parameters_are_the_published_ones(model, method, published):
    """The libraries' entries that the named -D functionals use hold the published numbers
    (D3 without its three-body term, D4 with dftd4's default one)."""
    mol = pyscf_molecule("water_dimer", "sto-3g")
    numbers, positions = _real(mol)
    if model == "d4":
        model_ = D4Model(numbers, positions, charge=0)
        explicit = DampingParam(**published)
    else:
        model_ = D3Model(numbers, positions)
        explicit = RationalDampingParam(**published, s9=0.0)
    assert dispersion_energy(Dispersion(model, method), mol) == pytest.approx(
        float(model_.get_dispersion(explicit, grad=False)["energy"]), abs=1e-12)


def test_dispersion_option_names_the_record_and_adds_to_the_functional(tmp_path):
    settings = RunSettings(molecule=molecule_path("water"), xc="b2plyp", dispersion="d3zero")
    assert settings.output_path().name == "water-cc-pvdz-b2plyp-d3zero.h5"
    ours = run(molecule_path("water"), tmp_path, basis="sto-3g", xc="b2plyp",
               dispersion="d3zero", grid=1)
    assert ours["xc"] == "B2PLYP-D3ZERO"
    mol = pyscf_molecule("water", "sto-3g")
    numbers, positions = _real(mol)
    assert ours["e_disp"] == pytest.approx(float(D3Model(numbers, positions).get_dispersion(
        ZeroDampingParam(method="b2plyp"), grad=False)["energy"]), abs=1e-12)


@pytest.mark.parametrize("args, message", [
    (["--xc", "b2plyp-d5"], "unknown functional"),
    (["--xc", "b2plyp", "--dispersion", "d5"], "Invalid value for '--dispersion'"),
    (["--xc", "0.53*HF + 0.47*B88, 0.73*LYP", "--mp2-os", "0.27", "--mp2-ss", "0.27",
      "--dispersion", "d3bj"], "needs a named functional"),
    (["--dispersion", "d4"], "give --xc too"),
    (["--xc", "DSD-PBEP86", "--dispersion", "d3bj"], "has no dispersion parameters"),
    # PySCF's Kohn-Sham SCF reads a -D3/-D4 ending of its string as its own dispersion: the
    # run ended in a traceback (pyscf-dispersion missing), or with it put PySCF's D3 into
    # E_KS while the record said e_disp 0 and the gradient left it out.
    (["--xc", "b3lyp-d3bj", "--mp2-os", "0.2", "--mp2-ss", "0.2"],
     "'b3lyp-d3bj' carries D3BJ, which PySCF's SCF would add to E_KS"),
    (["--xc", "0.5*HF + 0.5*B88, LYP-D4", "--mp2-os", "0.2", "--mp2-ss", "0.2"],
     "LYP-D4' carries D4, which PySCF's SCF"),
    (["--xc", "b97-3c", "--mp2-os", "0.2", "--mp2-ss", "0.2"],
     "carries a dispersion or composite-method term that PySCF does not run"),
    (["--xc", "B2PLYP-D3BJ", "--dispersion", "d4"], "includes its own dispersion"),
    (["--xc", "PBE0-DH-D3BJ"], "dftd3 has no D3BJ parameters for 'pbe0dh'"),
    (["--jk-auxbasis", "no-such-jkfit"], "choose another with --jk-auxbasis"),
    (["--jk-auxbasis", JK_FIT, "--scf", "conventional"], "needs --scf df"),
])
def test_bad_dispersion_and_jk_options_are_one_line_errors(run_cli, tmp_path, args, message):
    result = run_cli("run", molecule_path("water"), "--basis", "sto-3g", *args,
                     "-o", tmp_path / "w.h5")
    assert result.code == 2
    assert result.err.startswith("Error: ") and message in result.err
    assert len(result.err.strip().splitlines()) == 1 and "Traceback" not in result.err


@pytest.mark.parametrize("dispersion", ["d3bj", "d4"])
def test_element_without_parameters_is_one_line_error(run_cli, tmp_path, dispersion):
    """Rutherfordium (Z = 104) is past both libraries' reference sets; dftd3 would give it a
    zero C6 silently."""
    path = tmp_path / "rfh4.xyz"
    path.write_text("5\nRfH4\nRf 0 0 0\nH 1.1 1.1 1.1\nH -1.1 -1.1 1.1\nH -1.1 1.1 -1.1\n"
                    "H 1.1 -1.1 -1.1\n")
    result = run_cli("run", path, "--basis", "dyall-v2z", "--xc", "b2plyp", "--dispersion",
                     dispersion, "-o", tmp_path / "rf.h5")
    assert result.code == 2
    assert "parameters for Rf (Z = 104)" in result.err
    assert len(result.err.strip().splitlines()) == 1


@pytest.mark.parametrize("package", ["dftd3", "dftd4"])
def test_missing_extra_is_one_line_error_naming_it(run_cli, tmp_path, monkeypatch, package):
    monkeypatch.setitem(sys.modules, package, None)
    monkeypatch.setitem(sys.modules, f"{package}.interface", None)
    xc = "B2PLYP-D3BJ" if package == "dftd3" else "revDSD-PBEP86-D4"
    result = run_cli("run", molecule_path("water"), "--basis", "sto-3g", "--xc", xc,
                     "-o", tmp_path / "w.h5")
    assert result.code == 2
    assert "pip install 'dfmp2[dispersion]'" in result.err and package in result.err
    assert len(result.err.strip().splitlines()) == 1


def test_qcschema_keywords_reach_the_settings():
    from dfmp2.interfaces.qcschema import keyword_options
    assert keyword_options({"jk_auxbasis": JK_FIT, "dispersion": "d4"}) == {
        "jk_auxbasis": JK_FIT, "dispersion": "d4"}


def test_jk_auxbasis_is_recorded_and_matches_pyscf_df_rhf(run_cli, tmp_path):
    (tmp_path / "default").mkdir()
    default = run(molecule_path("water"), tmp_path / "default", basis="6-31g")
    ours = run(molecule_path("water"), tmp_path, basis="6-31g", jk_auxbasis=JK_FIT)
    mf = scf.RHF(pyscf_molecule("water", "6-31g")).density_fit(auxbasis=JK_FIT)
    mf.conv_tol, mf.conv_tol_grad, mf.verbose = 1e-12, 1e-7, 0
    mf.kernel()
    assert abs(ours["e_scf"] - mf.e_tot) <= 1e-10
    assert abs(ours["e_scf"] - default["e_scf"]) > 1e-6
    with h5py.File(ours["record"], "r") as h5:
        assert h5["input"].attrs["jk_auxbasis"] == JK_FIT
        assert h5["input"].attrs["jk_auxbasis_option"] == JK_FIT
    compared = run_cli("compare", ours["record"], "--reference", "pyscf", "--json")
    assert compared.code == 0, compared.err
    assert abs(json.loads(compared.out)[0]["delta_e_tot"]) <= 1e-8


def test_batch_recomputes_for_another_jk_auxbasis(run_cli, tmp_path):
    manifest = tmp_path / "jobs.txt"
    manifest.write_text(f"{molecule_path('water')} --basis 6-31g\n")
    out = tmp_path / "out"
    first = json.loads(run_cli("batch", manifest, "--out", out, "--json").out)
    assert [row["status"] for row in first] == ["complete"]
    again = json.loads(run_cli("batch", manifest, "--out", out, "--json").out)
    assert [row["status"] for row in again] == ["complete (skipped)"]
    manifest.write_text(f"{molecule_path('water')} --basis 6-31g --jk-auxbasis {JK_FIT}\n")
    refit = json.loads(run_cli("batch", manifest, "--out", out, "--json").out)
    assert [row["status"] for row in refit] == ["complete"]
    assert refit[0]["e_tot"] != pytest.approx(first[0]["e_tot"], abs=1e-7)
