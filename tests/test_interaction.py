"""Counterpoise-corrected interaction energies against the same procedure done with PySCF."""
from __future__ import annotations

import json
import logging
import shutil

import h5py
import numpy as np
import pytest
from pyscf import gto
from pyscf.data import elements

from conftest import molecule_path, pyscf_df_rhf, pyscf_dfmp2_reference
from dfmp2.df import auxbasis
from dfmp2.jobs import interaction
from dfmp2.input.xyz import read_xyz
from dfmp2.records.tree import read_record

KCAL = 627.5094740631


def _atoms(name: str) -> list[str]:
    lines = molecule_path(name).read_text().splitlines()
    return lines[2:2 + int(lines[0])]


def pyscf_energies(atom_lines: list[str], frozen_core: bool, charge: int = 0
                   ) -> dict[str, float]:
    """SCF, MP2 and SCS-MP2 totals from PySCF's own DF-RHF and DFMP2 (ghost- prefixes kept)."""
    mol = gto.M(atom="\n".join(atom_lines), basis="cc-pvdz", charge=charge, verbose=0)
    mf = pyscf_df_rhf(mol)
    pt = pyscf_dfmp2_reference(mf, elements.chemcore(mol) if frozen_core else 0)
    return {"scf": mf.e_tot, "mp2": mf.e_tot + pt.e_corr,
            "scs": mf.e_tot + 1.2 * pt.e_corr_os + pt.e_corr_ss / 3}


@pytest.fixture(scope="module")
def pyscf_water_dimer():
    atoms = _atoms("water_dimer")
    a, b = atoms[:3], atoms[3:]
    ghost = ["ghost-" + line.split(maxsplit=1)[0] + " " + line.split(maxsplit=1)[1]
             for line in atoms]
    return {
        "dimer": pyscf_energies(atoms, True),
        "a_cp": pyscf_energies(a + ghost[3:], True),
        "b_cp": pyscf_energies(ghost[:3] + b, True),
        "a": pyscf_energies(a, True),
        "b": pyscf_energies(b, True),
    }


def test_water_dimer_counterpoise_matches_pyscf(pyscf_water_dimer, run_cli, tmp_path):
    record = tmp_path / "wd.h5"
    result = run_cli("interaction", molecule_path("water_dimer"), "--split", "3",
                     "--frozen-core", "--backend", "torch", "--json", "-o", record)
    assert result.code == 0, result.err
    ours = json.loads(result.out)
    p = pyscf_water_dimer
    for kind in ("scf", "mp2", "scs"):
        cp = p["dimer"][kind] - p["a_cp"][kind] - p["b_cp"][kind]
        assert abs(ours[f"e_int_{kind}_cp"] - cp) <= 1e-8, kind
        assert ours[f"e_int_{kind}_cp_kcal"] == pytest.approx(cp * KCAL, abs=1e-5)
    nocp = p["dimer"]["mp2"] - p["a"]["mp2"] - p["b"]["mp2"]
    assert abs(ours["e_int_mp2_nocp"] - nocp) <= 1e-8
    assert -0.01 < ours["e_int_mp2_cp"] < -0.004 and ours["bsse_mp2"] < 0

    with h5py.File(record, "r") as h5:
        assert h5.attrs["schema"] == "dfmp2.interaction/1" and h5.attrs["status"] == "complete"
        for name in ("dimer", "monomer_a_cp", "monomer_b_cp", "monomer_a", "monomer_b"):
            assert "e_tot" in h5[name]["mp2"].attrs
        assert h5["monomer_a_cp/sizes"].attrs["nao"] == h5["dimer/sizes"].attrs["nao"]
        assert h5["monomer_a/sizes"].attrs["nao"] == h5["dimer/sizes"].attrs["nao"] // 2
        assert h5["monomer_a_cp/sizes"].attrs["naux"] == h5["dimer/sizes"].attrs["naux"]


def test_split_from_the_comment_line_and_bad_split(run_cli, tmp_path):
    result = run_cli("interaction", molecule_path("water_dimer"), "--basis", "sto-3g",
                     "--backend", "torch", "--json", "-o", tmp_path / "a.h5")
    assert result.code == 0, result.err
    bad = run_cli("interaction", molecule_path("water_dimer"), "--split", "6", "--backend",
                  "torch", "-o", tmp_path / "b.h5")
    assert bad.code == 2 and "must leave atoms in both monomers" in bad.err
    odd = run_cli("interaction", molecule_path("water_dimer"), "--split", "2", "--backend",
                  "torch", "-o", tmp_path / "c.h5")
    assert odd.code == 2 and odd.err.startswith("Error: monomer a cp:")


def test_a_split_that_cuts_a_bond_warns_and_one_atom_is_refused(run_cli, tmp_path, caplog):
    """The water dimer split after its first oxygen ran without a word (an O atom and an OH
    fragment beside a water: E_int(CP) -199 kcal/mol); a one-atom file said '1 <= N < 1'."""
    cut = run_cli("interaction", molecule_path("water_dimer"), "--split", "1", "--basis",
                  "sto-3g", "--backend", "torch", "--threads", "1", "-o", tmp_path / "a.h5")
    assert cut.code == 0, cut.err
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert [w for w in warnings if "cuts the bond" in w] == [
        "--split 1 cuts the bond between atom 1 (O) and atom 2 (H), 0.96 Angstrom apart: each "
        "monomer is a fragment of a molecule; check that monomer A is the first 1 atoms"]
    # compare said such a record held no SCF and MP2 energy, though it holds five of each.
    compared = run_cli("compare", tmp_path / "a.h5")
    assert compared.code == 2 and "whose energies are of several calculations" in compared.err
    caplog.clear()
    for split, geometry in ((3, molecule_path("water_dimer")),
                            (1, _xyz(tmp_path, "li_water", ["Li 0 0 0", "O 0 0 1.9",
                                                            "H 0 0.76 2.49", "H 0 -0.76 2.49"],
                                     "charge=1"))):
        interaction.resolve_split(read_xyz(geometry), split)
    assert not [r for r in caplog.records if "cuts the bond" in r.getMessage()]
    lone = _xyz(tmp_path, "ne", ["Ne 0 0 0"], "")
    refused = run_cli("interaction", lone, "--split", "1", "-o", tmp_path / "ne.h5")
    assert refused.code == 2
    assert refused.err.strip() == (f"Error: an interaction needs two monomers, and {lone} has "
                                   "one atom")


def _xyz(folder, name: str, atoms: list[str], comment: str):
    path = folder / f"{name}.xyz"
    path.write_text(f"{len(atoms)}\n{comment}\n" + "\n".join(atoms) + "\n")
    return path


HYDRONIUM_WATER = ["O 0 0 0", "H 0 0 1.0", "H 0.94 0 -0.33", "H -0.47 0.81 -0.33",
                   "O 0 0 2.55", "H 0 0.76 3.14", "H 0 -0.76 3.14"]


def test_a_charge_in_the_comment_line_is_split_by_charges_or_refused(run_cli, tmp_path):
    """H3O+ . H2O with charge=1 in its comment line: every fragment used to be computed
    neutral, an interaction energy wrong by orders of magnitude, with status 0. Now --charges
    must split the declared charge, and then the result is PySCF's counterpoise one."""
    xyz = tmp_path / "hydronium_water.xyz"
    xyz.write_text("7\ncharge=1 hydronium and water\n" + "\n".join(HYDRONIUM_WATER) + "\n")
    common = ("--split", "4", "--backend", "torch", "--json")
    missing = run_cli("interaction", xyz, *common, "-o", tmp_path / "a.h5")
    assert missing.code == 2 and "declares charge=1 for the dimer: give --charges" in missing.err
    wrong = run_cli("interaction", xyz, *common, "--charges", "0,0", "-o", tmp_path / "b.h5")
    assert wrong.code == 2 and "--charges 0,0 adds up to 0" in wrong.err
    assert not list(tmp_path.glob("*.h5"))

    result = run_cli("interaction", xyz, *common, "--charges", "1,0", "-o", tmp_path / "c.h5")
    assert result.code == 0, result.err
    ghosts = ["ghost-" + line for line in HYDRONIUM_WATER]
    dimer = pyscf_energies(HYDRONIUM_WATER, False, charge=1)
    hydronium = pyscf_energies(HYDRONIUM_WATER[:4] + ghosts[4:], False, charge=1)
    water = pyscf_energies(ghosts[:4] + HYDRONIUM_WATER[4:], False)
    expected = dimer["mp2"] - hydronium["mp2"] - water["mp2"]
    assert abs(json.loads(result.out)["e_int_mp2_cp"] - expected) <= 1e-8
    assert expected < -0.01, "an ion binds water by tens of kcal/mol"


def test_a_multiplicity_in_the_comment_line_is_split_by_spins_or_refused(run_cli, tmp_path):
    xyz = tmp_path / "oh_water.xyz"
    xyz.write_text("5\nmultiplicity=2 hydroxyl radical and water\nO 0 0 0\nH 0 0 0.97\n"
                   "O 0 0 2.9\nH 0 0.76 3.49\nH 0 -0.76 3.49\n")
    missing = run_cli("interaction", xyz, "--split", "2", "--backend", "torch", "-o",
                      tmp_path / "a.h5")
    assert missing.code == 2
    assert "declares multiplicity=2 (2S = 1) for the dimer: give --spins a,b" in missing.err
    wrong = run_cli("interaction", xyz, "--split", "2", "--spins", "1,2", "--backend", "torch",
                    "-o", tmp_path / "b.h5")
    assert wrong.code == 2 and "--spins 1,2 adds up to 3" in wrong.err
    # A negative 2S was refused as the monomer calculation's "--spin must be non-negative".
    negative = run_cli("interaction", xyz, "--split", "2", "--spins", "2,-1", "--backend",
                       "torch", "-o", tmp_path / "c.h5")
    assert negative.code == 2 and "--spins 2,-1: each is a monomer's 2S" in negative.err


@pytest.mark.parametrize("options, said", [
    (("--spins", "1,0"), "dimer: 20 electrons cannot have spin 2S=1: the parity differs; "
                         "--spins a,b are the monomers' 2S"),
    (("--charges=-20,0",), "do not fit in the basis's 14 orbitals; check --charges and --spins"),
])
def test_a_fragment_error_names_this_commands_options(options, said, run_cli, tmp_path):
    """The remedy named run's --spin and --charge, which interaction refuses as unknown."""
    dimer = tmp_path / "dimer.xyz"
    dimer.write_text("6\nwater dimer\n" + "\n".join(_atoms("water_dimer")) + "\n")
    result = run_cli("interaction", dimer, "--split", "3", "--basis", "sto-3g", *options,
                     "-o", tmp_path / "d.h5")
    assert result.code == 2 and said in result.err
    assert "--spin " not in result.err and "--charge " not in result.err
    assert not (tmp_path / "d.h5").exists()


@pytest.mark.parametrize("command", ["interaction", "optimize"])
def test_a_rerun_of_the_same_job_leaves_no_superseded_copy(command, run_cli, tmp_path,
                                                           caplog):
    """The complete record moved aside for a rerun of the same inputs is dropped once the
    rerun completes, as run's and properties' are: interaction and optimize kept one full
    copy per rerun. show prints an interaction record's table, not its attribute dump."""
    molecule = molecule_path("water_dimer" if command == "interaction" else "water")
    args = (command, molecule, "--basis", "sto-3g", "--backend", "torch", "--threads", "1",
            "-o", tmp_path / "r.h5")
    for _ in range(2):
        result = run_cli(*args)
        assert result.code == 0, result.err
    assert "kept as" not in caplog.text
    assert sorted(p.name for p in tmp_path.glob("*.h5")) == ["r.h5"]
    if command == "interaction":
        shown = run_cli("show", tmp_path / "r.h5").out
        assert shown.startswith("dfmp2 interaction record: status complete")
        assert "CP kcal/mol" in shown and len(shown.splitlines()) < 30


def test_a_failed_rerun_names_the_complete_record_it_set_aside(run_cli, tmp_path):
    """The complete optimisation moved aside for a rerun that then failed was named nowhere."""
    args = ("optimize", molecule_path("water"), "--basis", "sto-3g", "--backend", "torch",
            "--threads", "1", "-o", tmp_path / "o.h5")
    assert run_cli(*args).code == 0
    failed = run_cli(*args, "--max-steps", "1")
    assert failed.code == 1
    kept = list(tmp_path.glob("o.superseded-*.h5"))
    assert len(kept) == 1 and f"the earlier complete record is kept as {kept[0]}" in failed.err


def test_a_charge_the_comment_line_does_not_read_is_refused_for_a_dimer(run_cli, tmp_path):
    """Read when the charge and spin are resolved, a 'charge -2' the line does not read must
    stop the interaction too, which splits the charge itself, and name its own option."""
    lines = molecule_path("water_dimer").read_text().splitlines()
    dimer = tmp_path / "dimer.xyz"
    dimer.write_text("\n".join([lines[0], "water dimer, charge -2", *lines[2:]]) + "\n")
    result = run_cli("interaction", dimer, "--split", "3", "--basis", "sto-3g",
                     "-o", tmp_path / "i.h5")
    assert result.code == 2 and "'charge -2' is not read" in result.err
    assert "give --charges A,B" in result.err


def test_an_unstable_reference_is_named_with_the_interaction_energies(run_cli, tmp_path):
    """A radical dimer's UKS landed on an excited solution (+68 kcal/mol instead of 0): the
    only hint was a stability warning that did not say which of the five calculations it
    meant, and neither --json nor show marked it."""
    record = tmp_path / "i.h5"
    result = run_cli("interaction", molecule_path("water_dimer"), "--basis", "sto-3g",
                     "--backend", "torch", "--threads", "1", "-o", record, "--json")
    assert json.loads(result.out)["unstable_references"] == {}
    with h5py.File(record, "r+") as h5:
        h5["dimer/scf"].attrs["stability"] = "unstable"
        h5["dimer/scf"].attrs["stability_eigenvalue"] = -0.4566
    shown = run_cli("show", record).out
    assert ("Warning: the dimer's reference is internally unstable (lowest orbital-Hessian "
            "eigenvalue -0.4566)") in shown
    assert interaction.json_summary(read_record(record), record)["unstable_references"] == {
        "dimer": -0.4566}


def test_an_unfinished_record_of_another_command_is_not_replaced(run_cli, tmp_path):
    """An interrupted `run` record at -o (its SCF and finished pairs, which `run` resumes) was
    overwritten by the interaction job without a word."""
    record = tmp_path / "k.h5"
    args = (molecule_path("water_dimer"), "--basis", "sto-3g", "--backend", "torch",
            "--threads", "1", "-o", record)
    assert run_cli("run", *args).code == 0
    with h5py.File(record, "r+") as h5:
        h5.attrs["status"] = "interrupted"
    refused = run_cli("interaction", *args)
    assert refused.code == 2 and "unfinished dfmp2.run/" in refused.err
    stored = read_record(record)
    assert stored.attrs["status"] == "interrupted" and "mp2" in stored.groups


@pytest.mark.parametrize("atoms, basis, kind, option", [
    # Iodine has no def2-SVP-RI set and lithium no cc-pVDZ-JKFIT set: PySCF generates them,
    # and for a ghost it generated them from a nuclear charge of zero (12 s functions for
    # iodine instead of 225: the counterpoise MP2 energy was 6e-6 Eh off).
    ("H 0 0 -1.6; {}I 0 0 0; H 0 0 3.0; F 0 0 3.9", "def2-svp", "ri", None),
    ("{}Li 0 0 0; H 0 0 1.6; H 0 0 3.6; F 0 0 4.5", "cc-pvdz", "jk", None),
    # PySCF's 'autoaux' generates every element's set, a ghost's again from a nuclear charge
    # of zero: the water dimer's counterpoise E_int moved by 3.9e-7 Eh (SCF) and 1.5e-7 Eh
    # (MP2) with --auxbasis autoaux --jk-auxbasis autoaux.
    ("O 0 0 0; H 0 0.76 0.59; H 0 -0.76 0.59; {0}O 0 0 2.9; {0}H 0 0.76 3.5", "cc-pvdz", "ri",
     "autoaux"),
    ("{0}O 0 0 0; {0}H 0 0.76 0.59; H 0 -0.76 0.59; F 0 0 2.9", "cc-pvdz", "jk", "autoaux"),
])
def test_a_ghost_atom_carries_its_elements_fitting_functions(atoms, basis, kind, option):
    choose = {"ri": auxbasis.ri_basis, "jk": auxbasis.jk_basis}[kind]
    real = gto.M(atom=atoms.format(""), basis=basis, verbose=0, spin=None)
    ghost = gto.M(atom=atoms.format("ghost-"), basis=basis, verbose=0, spin=None)
    real_aux = auxbasis.make_auxmol(real, choose(real, option))
    ghost_aux = auxbasis.make_auxmol(ghost, choose(ghost, option))
    assert ghost_aux.nao_nr() == real_aux.nao_nr()
    ghost_shells, real_shells = ghost_aux.bas_exps(), real_aux.bas_exps()
    assert len(ghost_shells) == len(real_shells)
    assert all(np.array_equal(g, r) for g, r in zip(ghost_shells, real_shells))


def test_an_interrupted_interaction_resumes_its_finished_calculations(run_cli, tmp_path,
                                                                      caplog):
    """The record was written only at the end, so an interrupted job (or a batch's dimer
    line) started all five calculations again. Finished ones are now taken from the record
    and an unfinished one resumes from its checkpoint, to the uninterrupted energies."""
    caplog.set_level(logging.INFO)
    args = ("interaction", molecule_path("water_dimer"), "--basis", "sto-3g", "--backend",
            "torch", "--threads", "1")
    whole = tmp_path / "whole.h5"
    assert run_cli(*args, "-o", whole).code == 0
    cut = tmp_path / "cut.h5"
    shutil.copy(whole, cut)
    with h5py.File(cut, "r+") as h5:
        h5.attrs["status"] = "interrupted"
        for name in ("interaction", "monomer_a", "monomer_b", "monomer_b_cp/mp2"):
            del h5[name]
    assert run_cli(*args, "-o", cut).code == 0
    assert "dimer: taken from the interrupted record" in caplog.text
    assert "monomer_b_cp: taken" not in caplog.text
    with h5py.File(whole, "r") as a, h5py.File(cut, "r") as b:
        assert b.attrs["status"] == "complete"
        for key, value in a["interaction"].attrs.items():
            if key.startswith("e_int"):
                assert b["interaction"].attrs[key] == pytest.approx(value, abs=1e-10), key
        # The kernels of the calculations taken from the record count in its ledger.
        assert b["backend"].attrs["calls.mp2_energy.torch-cpu"] == len(interaction.CALCULATIONS)


def test_an_unfinished_interaction_of_other_calculations_is_kept(run_cli, tmp_path):
    """It was replaced without a word, by the command and by a batch line whose options
    had changed; the command now refuses it, and a batch moves it aside."""
    out = tmp_path / "out"
    manifest = tmp_path / "jobs.txt"
    manifest.write_text(f"{molecule_path('water_dimer')} --split 3 --basis sto-3g\n")
    batch = ("batch", manifest, "--backend", "torch", "--threads", "1", "--out", out)
    assert run_cli(*batch).code == 0
    [record] = out.glob("*-interaction.h5")
    with h5py.File(record, "r+") as h5:
        h5.attrs["status"] = "interrupted"
    refused = run_cli("interaction", molecule_path("water_dimer"), "--split", "3", "--basis",
                      "sto-3g", "--frozen-core", "--threads", "1", "-o", record)
    assert refused.code == 2 and "unfinished interaction job of other calc" in refused.err
    manifest.write_text(f"{molecule_path('water_dimer')} --split 3 --basis sto-3g "
                        "--frozen-core\n")
    assert run_cli(*batch).code == 0
    [kept] = out.glob("*-interaction.unfinished-*.h5")
    assert read_record(kept).attrs["status"] == "interrupted"
    assert read_record(record).attrs["status"] == "complete"


@pytest.mark.parametrize("text, pair", [("0,0", (0, 0)), (" +1 , -1 ", (1, -1)),
                                        ("1_0,-1_0", None), ("\uff10,\uff10", None),
                                        ("1,2,3", None), ("1", None)])
def test_charges_and_spins_are_two_integers_in_ascii_digits(text, pair):
    """int() read --charges 1_0,-1_0 as +10 and -10, and full-width digits as digits."""
    from dfmp2.errors import InputError
    from dfmp2.jobs.interaction import parse_pair

    if pair is None:
        with pytest.raises(InputError, match="write two integers as a,b"):
            parse_pair(text, "--charges")
    else:
        assert parse_pair(text, "--charges") == pair
