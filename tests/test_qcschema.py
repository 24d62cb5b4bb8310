"""QCSchema: the QCEngine harness `dfmp2` and `dfmp2 run --qcschema` against `dfmp2 run`."""
from __future__ import annotations

import base64
import json
import shlex

from pathlib import Path

import h5py
import numpy as np
import pytest
import qcengine
from qcelemental.models.v2 import Molecule

import dfmp2.qcengine  # noqa: F401  (registers the harness)
from conftest import molecule_path
from dfmp2.jobs import run as run_job
from dfmp2.records.report import json_summary
from dfmp2.input.settings import RunSettings
from dfmp2.input.xyz import read_xyz

BOHR = 0.52917721092  # PySCF's Angstrom per Bohr, the one dfmp2 converts with


def water_molecule() -> dict:
    """Bundled water as a QCSchema molecule. QCElemental rounds geometries to 1e-8 Bohr, so
    the coordinates are those it keeps (and :func:`water_xyz` writes the same numbers)."""
    geometry = read_xyz(molecule_path("water")).coords / BOHR
    molecule = {"symbols": ["O", "H", "H"], "geometry": geometry.ravel().tolist(),
                "fix_com": True, "fix_orientation": True}
    return {**molecule, "geometry": Molecule(**molecule).geometry.ravel().tolist()}


def water_xyz(tmp_path) -> Path:
    coords = np.asarray(water_molecule()["geometry"]).reshape(-1, 3)
    path = tmp_path / "water-qcschema.xyz"
    path.write_text("3\nunits=bohr\n" + "".join(
        f"{s} {x!r} {y!r} {z!r}\n" for s, (x, y, z) in zip("OHH", coords.tolist())))
    return path


def run_record(tmp_path, name: str, **options):
    settings = RunSettings(molecule=water_xyz(tmp_path), output=tmp_path / f"{name}.h5",
                           show_progress=False, **options)
    return run_job.run(settings).record


def test_energy_equals_dfmp2_run_with_record_among_native_files(tmp_path):
    result = qcengine.compute(
        {"molecule": water_molecule(), "driver": "energy",
         "model": {"method": "mp2", "basis": "cc-pvdz"}, "keywords": {"frozen_core": True},
         "protocols": {"native_files": "all"}},
        "dfmp2", return_version=2)
    assert result.success, getattr(result, "error", None)
    ours = json_summary(run_record(tmp_path, "run", frozen_core=True), "")
    properties = result.properties
    assert result.return_result == pytest.approx(ours["e_tot"], abs=1e-10)
    assert properties.return_energy == pytest.approx(ours["e_tot"], abs=1e-10)
    assert properties.scf_total_energy == pytest.approx(ours["e_scf"], abs=1e-10)
    assert properties.mp2_correlation_energy == pytest.approx(ours["e_corr"], abs=1e-10)
    assert properties.mp2_same_spin_correlation_energy == pytest.approx(ours["e_ss"], abs=1e-10)
    assert properties.mp2_opposite_spin_correlation_energy == pytest.approx(ours["e_os"],
                                                                            abs=1e-10)
    assert properties.mp2_total_energy == pytest.approx(ours["e_tot"], abs=1e-10)
    assert (properties.calcinfo_nbasis, properties.calcinfo_nmo, properties.calcinfo_nalpha,
            properties.calcinfo_nbeta, properties.calcinfo_natom) == (24, 24, 5, 5, 3)
    assert result.provenance.creator == "dfmp2"
    assert result.extras["dfmp2"]["backend"] == "torch"
    record = tmp_path / "from-native-files.h5"
    record.write_bytes(base64.b64decode(result.native_files["record.h5.base64"]))
    with h5py.File(record, "r") as h5:
        assert h5.attrs["status"] == "complete"
        assert h5["mp2"].attrs["e_tot"] == pytest.approx(ours["e_tot"], abs=1e-10)


def test_gradient_equals_dfmp2_gradient(tmp_path):
    result = qcengine.compute(
        {"molecule": water_molecule(), "driver": "gradient",
         "model": {"method": "scs-mp2", "basis": "cc-pvdz"}}, "dfmp2", return_version=2)
    assert result.success, getattr(result, "error", None)
    record = run_record(tmp_path, "grad", task="gradient", method="scs-mp2")
    expected = np.asarray(record.groups["gradient"].datasets["gradient"])
    assert np.abs(np.asarray(result.return_result) - expected).max() <= 1e-9
    assert result.properties.return_energy == pytest.approx(
        record.groups["gradient"].attrs["e_tot"], abs=1e-10)


def test_scs_energy_and_double_hybrid_methods(tmp_path):
    energies = {}
    for method in ("scs-mp2", "B2PLYP"):
        result = qcengine.compute(
            {"molecule": water_molecule(), "driver": "energy",
             "model": {"method": method, "basis": "cc-pvdz"}}, "dfmp2", return_version=2)
        assert result.success, getattr(result, "error", None)
        energies[method] = result
    mp2 = json_summary(run_record(tmp_path, "mp2"), "")
    assert energies["scs-mp2"].return_result == pytest.approx(
        mp2["e_scf"] + mp2["e_scs"], abs=1e-10)
    b2plyp = json_summary(run_record(tmp_path, "b2plyp", xc="b2plyp"), "")
    assert energies["B2PLYP"].return_result == pytest.approx(b2plyp["e_tot"], abs=1e-10)
    assert energies["B2PLYP"].properties.scf_total_energy == pytest.approx(b2plyp["e_scf"],
                                                                           abs=1e-10)
    assert energies["B2PLYP"].properties.mp2_total_energy is None


def test_ghost_atoms_are_counterpoise_monomers(run_cli, tmp_path):
    """A QCSchema dimer whose second water is ghost (real false) is the interaction
    command's monomer A in the dimer basis."""
    dimer = read_xyz(molecule_path("water_dimer"))
    molecule = {"symbols": list(dimer.symbols),
                "geometry": (dimer.coords / BOHR).ravel().tolist(),
                "real": [True] * 3 + [False] * 3, "fix_com": True, "fix_orientation": True}
    result = qcengine.compute({"molecule": molecule, "driver": "energy",
                               "model": {"method": "mp2", "basis": "sto-3g"},
                               "keywords": {"record": str(tmp_path / "g.h5")}}, "dfmp2",
                              return_version=2)
    assert result.success, getattr(result, "error", None)
    # show names the ghosts (it said only qcschema-H4O2).
    assert "ghosts   atoms [3, 4, 5]" in run_cli("show", tmp_path / "g.h5").out
    interaction = run_cli("interaction", molecule_path("water_dimer"), "--basis", "sto-3g",
                          "-o", tmp_path / "i.h5")
    assert interaction.code == 0, interaction.err
    with h5py.File(tmp_path / "i.h5", "r") as h5:
        expected = h5["monomer_a_cp/mp2"].attrs["e_tot"]
    assert result.return_result == pytest.approx(expected, abs=1e-9)


@pytest.mark.parametrize("spec, message", [
    ({"driver": "energy", "model": {"method": "ccsd", "basis": "cc-pvdz"}},
     "not an MP2 method (mp2, scs-mp2, sos-mp2)"),
    ({"driver": "energy", "model": {"method": "mp2", "basis": "cc-pvdz"},
      "keywords": {"frozen_cor": True}}, "unknown keyword 'frozen_cor'"),
    ({"driver": "energy", "model": {"method": "mp2", "basis": "cc-pvdz"},
      "keywords": {"frozen_core": "yes"}}, "must be true or false"),
    # The command line's ranges hold here too: these gave absurd energies with success true.
    ({"driver": "energy", "model": {"method": "scs-mp2", "basis": "sto-3g"},
      "keywords": {"scs_os": 1e300}}, "scs_os: 1e+300 is not a scale factor"),
    ({"driver": "energy", "model": {"method": "scs-mp2", "basis": "sto-3g"},
      "keywords": {"scs_os": float("nan")}}, "scs_os: nan is not a finite number"),
    ({"driver": "energy", "model": {"method": "0.5*HF + 0.5*B88, LYP", "basis": "sto-3g"},
      "keywords": {"mp2_os": 1e200, "mp2_ss": 0.3}}, "mp2_os: 1e+200 is not a scale factor"),
    ({"driver": "energy", "model": {"method": "mp2", "basis": "sto-3g"},
      "keywords": {"occ_block": 0}}, "occ_block 0 must be a whole number of at least 1"),
    ({"driver": "energy", "model": {"method": "mp2", "basis": "sto-3g"},
      "keywords": {"frozen": -1}}, "frozen -1 must be a whole number of at least 0"),
    ({"driver": "energy", "model": {"method": "mp2", "basis": "sto-3g"},
      "keywords": {"record": 123}}, "keyword record must be a path"),
    # The option's spelling was pasted in with its description, mid-sentence, twice.
    ({"driver": "energy", "model": {"method": "b2plyp", "basis": "sto-3g"},
      "keywords": {"scs_os": 1.5}},
     "keyword scs_os scales SCS-MP2, not the double hybrid model.method b2plyp; drop it (a "
     "custom model.method takes keyword mp2_os and keyword mp2_ss)"),
    # Path() dropped the slash: the record was written as a file named after the folder.
    ({"driver": "energy", "model": {"method": "mp2", "basis": "sto-3g"},
      "keywords": {"record": "qdir/"}}, "keyword record 'qdir/' names a folder"),
    ({"driver": "energy", "model": {"method": "mp2", "basis": "sto-3g"},
      "keywords": {"record": ""}}, "keyword record is empty"),
    # The command line refuses SCS scales for a gradient, density or Hessian of another
    # method; these were dropped, and the numbers were plain MP2's and SOS-MP2's.
    ({"driver": "gradient", "model": {"method": "mp2", "basis": "sto-3g"},
      "keywords": {"scs_os": 1.1, "scs_ss": 0.5}},
     "keyword scs_os and keyword scs_ss scale SCS-MP2, and this computes MP2"),
    ({"driver": "hessian", "model": {"method": "sos-mp2", "basis": "sto-3g"},
      "keywords": {"scs_os": 2.0}}, "keyword scs_os scales SCS-MP2, and this computes SOS-MP2"),
    ({"driver": "properties", "model": {"method": "mp2", "basis": "sto-3g"},
      "keywords": {"scs_ss": 0.5}}, "keyword scs_ss scales SCS-MP2, and this computes MP2"),
    # Given at its default value it still asks for SCS-MP2, as on the command line.
    ({"driver": "gradient", "model": {"method": "mp2", "basis": "sto-3g"},
      "keywords": {"scs_os": 1.2}},
     "keyword scs_os scales SCS-MP2, and this computes MP2; set model.method to scs-mp2"),
    # A QCSchema BasisSet in place of a name came back as an unknown_error with a traceback
    # ('BasisSet' object has no attribute 'strip').
    ({"driver": "energy", "model": {"method": "mp2", "basis": {
        "name": "sto-3g-h", "atom_map": ["h_s", "h_s", "h_s"], "center_data": {"h_s": {
            "electron_shells": [{"harmonic_type": "spherical", "angular_momentum": [0],
                                 "exponents": ["3.42525091", "0.62391373", "0.16885540"],
                                 "coefficients": [["0.15432897", "0.53532814",
                                                   "0.44463454"]]}]}}}}},
     "model.basis is a QCSchema BasisSet ('sto-3g-h'); dfmp2 takes a basis name"),
    # PySCF reads the string; its own reason, not 'not an exchange-correlation string'.
    ({"driver": "energy", "model": {"method": "0.5*HF + 0.5*B88, 1e200*LYP", "basis": "sto-3g"},
      "keywords": {"mp2_os": 0.27, "mp2_ss": 0.27}},
     "has a coefficient of 1e+200: give coefficients between -100 and 100"),
])
def test_bad_inputs_are_input_errors(spec, message):
    result = qcengine.compute({"molecule": water_molecule(), **spec}, "dfmp2",
                              return_version=2)
    assert not result.success
    assert result.error.error_type == "input_error" and message in result.error.error_message


def test_a_scratch_directory_that_cannot_hold_a_folder_is_an_input_error(tmp_path):
    """QCEngine's scratch_directory missing: a traceback came back as an unknown_error."""
    result = qcengine.compute({"molecule": water_molecule(), "driver": "energy",
                               "model": {"method": "mp2", "basis": "sto-3g"}}, "dfmp2",
                              task_config={"scratch_directory": str(tmp_path / "missing")},
                              return_version=2)
    assert not result.success and result.error.error_type == "input_error"
    assert "scratch_directory" in result.error.error_message
    assert "Traceback" not in result.error.error_message


def test_an_error_does_not_point_at_the_calls_vanished_scratch_record():
    result = qcengine.compute({"molecule": water_molecule(), "driver": "energy",
                               "model": {"method": "mp2", "basis": "sto-3g"},
                               "keywords": {"frozen": 50}}, "dfmp2", return_version=2)
    assert not result.success
    assert "cannot freeze 50" in result.error.error_message
    assert "dfmp2-qcschema-" not in result.error.error_message
    # It names the keyword, not the command line's --frozen.
    assert "lower keyword frozen" in result.error.error_message


@pytest.mark.parametrize("molecule, keywords, message", [
    ({"molecular_charge": -20}, {},
     "check molecule.molecular_charge and molecule.molecular_multiplicity"),
    ({}, {"auxbasis": "no-such-fit"}, "choose another with keyword auxbasis"),
    # The record's messages said -o.
    ({}, {"record": "/dev/null"}, "choose another keyword record")])
def test_errors_name_the_atomic_inputs_fields_not_command_line_options(molecule, keywords,
                                                                        message):
    result = qcengine.compute({"molecule": {**water_molecule(), **molecule},
                               "driver": "energy", "model": {"method": "mp2", "basis": "sto-3g"},
                               "keywords": keywords}, "dfmp2", return_version=2)
    assert not result.success and "--" not in result.error.error_message
    assert " -o" not in result.error.error_message
    assert message in result.error.error_message


def test_run_qcschema_prints_the_harness_result(run_cli, tmp_path):
    printed = run_cli("run", water_xyz(tmp_path), "--xc", "pbe0-dh", "--frozen-core",
                      "--qcschema", "--qcschema-version", "2", "-o", tmp_path / "w.h5")
    assert printed.code == 0, printed.err
    document = json.loads(printed.out)
    assert document["schema_name"] == "qcschema_atomic_result" and document["success"]
    specification = document["input_data"]["specification"]
    assert specification["model"] == {"method": "pbe0-dh", "basis": "cc-pvdz"}
    assert specification["keywords"] == {"frozen_core": True}
    harness = qcengine.compute(document["input_data"], "dfmp2", return_version=2)
    assert harness.success, getattr(harness, "error", None)
    assert document["return_result"] == pytest.approx(harness.return_result, abs=1e-10)
    for key in ("scf_total_energy", "mp2_correlation_energy", "return_energy",
                "calcinfo_nbasis"):
        assert document["properties"][key] == pytest.approx(getattr(harness.properties, key),
                                                            abs=1e-10)
    assert run_cli("run", molecule_path("water"), "--json", "--qcschema").code == 2


def test_run_qcschema_prints_version_1_by_default_as_the_harness_returns(run_cli, tmp_path):
    """``qcelemental.models.AtomicResult`` (v1) reads what ``--qcschema`` prints, and QCEngine
    given the same input as a dict returns the same version with the same numbers."""
    from qcelemental.models import AtomicResult
    printed = run_cli("run", water_xyz(tmp_path), "--frozen-core", "--qcschema",
                      "-o", tmp_path / "w.h5")
    assert printed.code == 0, printed.err
    result = AtomicResult(**json.loads(printed.out))
    assert result.schema_version == 1 and result.success
    harness = qcengine.compute({"molecule": water_molecule(), "driver": "energy",
                                "model": {"method": "mp2", "basis": "cc-pvdz"},
                                "keywords": {"frozen_core": True}}, "dfmp2")
    assert harness.success and harness.schema_version == 1
    assert result.return_result == pytest.approx(harness.return_result, abs=1e-9)
    assert result.properties.mp2_correlation_energy == pytest.approx(
        harness.properties.mp2_correlation_energy, abs=1e-9)
    assert run_cli("run", water_xyz(tmp_path), "--qcschema-version", "2").code == 2


def test_the_equivalent_command_line_runs_the_same_calculation(run_cli, tmp_path):
    """native_files['input'] left out the charge and spin (an anion's line computed the
    neutral radical's input and failed) and wrote --nki-mode/--require-nki, which the
    command line takes from environment variables."""
    hydroxide = {"symbols": ["O", "H"], "geometry": [0.0, 0.0, 0.0, 0.0, 0.0, 1.83],
                 "molecular_charge": -1, "fix_com": True, "fix_orientation": True}
    result = qcengine.compute({"molecule": hydroxide, "driver": "energy",
                               "model": {"method": "mp2", "basis": "6-31g"},
                               "keywords": {"require_nki": False, "frozen_core": True},
                               "protocols": {"native_files": "all"}}, "dfmp2",
                              return_version=2)
    assert result.success, getattr(result, "error", None)
    words = shlex.split(result.native_files["input"])
    assert words[:2] == ["DFMP2_REQUIRE_NKI=0", "dfmp2"]
    molecule = tmp_path / "hydroxide.xyz"
    molecule.write_text(f"2\n\nO 0 0 0\nH 0 0 {1.83 * BOHR:.12f}\n")
    words = [str(molecule) if word == "<molecule>.xyz" else word for word in words[2:]]
    again = run_cli(*words, "--threads", "1", "-o", tmp_path / "again.h5", "--json")
    assert again.code == 0, again.err
    assert json.loads(again.out)["e_tot"] == pytest.approx(result.return_result, abs=1e-9)


def test_a_fractional_multiplicity_is_an_input_error():
    """QCElemental keeps a multiplicity of 1.9, which was computed as a singlet."""
    result = qcengine.compute({"molecule": {**water_molecule(), "molecular_multiplicity": 2.9},
                               "driver": "energy", "model": {"method": "mp2", "basis": "sto-3g"}},
                              "dfmp2", return_version=2)
    assert not result.success and result.error.error_type == "input_error"
    assert "multiplicity 2.9 is not an integer" in result.error.error_message


def test_a_molecule_of_ghost_atoms_only_is_said_to_be_one():
    """It was told 'charge +0 leaves 0 electrons; lower the charge'."""
    molecule = {**water_molecule(), "real": [False, False, False]}
    result = qcengine.compute({"molecule": molecule, "driver": "energy",
                               "model": {"method": "mp2", "basis": "sto-3g"}}, "dfmp2",
                              return_version=2)
    assert not result.success and result.error.error_type == "input_error"
    assert "every atom of the molecule is a ghost" in result.error.error_message
