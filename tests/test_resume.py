"""Resuming a record: the remaining pairs finished, other options refused, and what cannot be
resumed (a corrupt record, a run stopped before its SCF, stored orbitals or sums that do not
fit) started again or refused. (A run killed mid-energy: test_records.)"""
from __future__ import annotations

import json
import os
import shutil

import h5py
import pytest

from conftest import (WATER_RECORD_ARGS, as_interrupted, molecule_path, pyscf_df_rhf,
                      pyscf_dfmp2_reference, pyscf_molecule)
from dfmp2.records.tree import read_record


@pytest.fixture
def interrupted_water(tmp_path):
    """A water record as an interrupted run leaves it: SCF and a checkpoint, status running."""
    from dfmp2.jobs.run import run
    from dfmp2.input.settings import RunSettings
    record = tmp_path / "water.h5"
    run(RunSettings(molecule=molecule_path("water"), backend="torch", output=record,
                    occ_block=1, show_progress=False))
    as_interrupted(record, 3)
    return record


def test_resume_with_other_options_is_refused(interrupted_water, run_cli):
    result = run_cli("run", molecule_path("water"), "--basis", "sto-3g", "--backend", "torch",
                     "-o", interrupted_water)
    assert result.code == 2
    assert "different basis" in result.err and len(result.err.strip().splitlines()) == 1
    assert read_record(interrupted_water).attrs["status"] == "running"


def test_a_note_added_to_the_comment_line_does_not_make_another_molecule(interrupted_water,
                                                                          run_cli, tmp_path):
    """The record compared the XYZ file's text: a note added to its comment line made the
    interrupted run's molecule another one ('holds an interrupted run with different xyz'),
    and its finished work could not be resumed. A moved atom is still another molecule."""
    lines = molecule_path("water").read_text().splitlines()
    noted = tmp_path / "water.xyz"
    noted.write_text("\n".join([lines[0], "water, geometry from the 2019 paper", *lines[2:]])
                     + "\n")
    args = ("run", noted, "--backend", "torch", "--threads", "1", "-o", interrupted_water)
    moved = tmp_path / "moved.xyz"
    moved.write_text(noted.read_text().replace(lines[2], lines[2] + "1"))
    refused = run_cli("run", moved, *args[2:], "--resume")
    assert refused.code == 2 and "different xyz" in refused.err
    result = run_cli(*args, "--resume", "--json")
    assert result.code == 0, result.err
    assert read_record(interrupted_water).attrs["resumed"]
    reference = pyscf_dfmp2_reference(pyscf_df_rhf(pyscf_molecule("water", "cc-pvdz")), 0)
    assert abs(json.loads(result.out)["e_tot"] - reference.e_tot) <= 1e-8


def test_resume_finishes_the_remaining_pairs(interrupted_water, run_cli, tmp_path):
    result = run_cli("run", molecule_path("water"), "--backend", "torch", "--resume", "--json",
                     "-o", interrupted_water)
    assert result.code == 0, result.err
    reference = run_cli("run", molecule_path("water"), "--backend", "torch", "--json",
                        "-o", tmp_path / "fresh.h5")
    assert abs(json.loads(result.out)["e_corr"] - json.loads(reference.out)["e_corr"]) <= 1e-10
    assert read_record(interrupted_water).attrs["resumed"]


def test_resume_from_a_corrupt_record_is_refused(tmp_path, run_cli):
    record = tmp_path / "broken.h5"
    record.write_bytes(b"\x89HDF\r\n\x1a\n" + os.urandom(512))
    result = run_cli("run", molecule_path("water"), "--backend", "torch", "--resume",
                     "-o", record)
    assert result.code == 2 and result.err.startswith("Error:")
    assert len(result.err.strip().splitlines()) == 1


@pytest.mark.parametrize("state", ["interrupted", "running", "failed", "never written"])
def test_resume_of_a_run_stopped_before_its_scf_starts_it_again(state, run_cli, tmp_path,
                                                                 caplog, water_record):
    """A run stopped (SIGTERM, SIGKILL, a failure) before its SCF was saved, or while it
    started, before it wrote its record, holds nothing to resume: `--resume` (which a
    requeued job passes every time) starts it again with a warning and ends with the energy
    of a fresh run (it used to be refused: 'holds no checkpoint', 'no record to resume')."""
    record = tmp_path / "stopped.h5"
    shutil.copy(water_record, record)
    with h5py.File(record, "r+") as h5:
        e_fresh = float(h5["mp2"].attrs["e_tot"])
        h5.attrs["status"] = state
        for name in ("scf", "mp2", "checkpoint"):
            del h5[name]
    if state == "never written":
        record.unlink()
    resumed = run_cli(*WATER_RECORD_ARGS, "--json", "--resume", "-o", record)
    assert resumed.code == 0, resumed.err
    warning = "no record at" if state == "never written" else "starting it again"
    assert any(warning in r.getMessage() for r in caplog.records)
    assert json.loads(resumed.out)["e_tot"] == pytest.approx(e_fresh, abs=1e-10)
    with h5py.File(record, "r") as h5:
        assert h5.attrs["status"] == "complete"


def _resumed_after_altering(run_cli, tmp_path, water_record, alter) -> tuple[float, object]:
    """The E_tot of the complete water/STO-3G record, and the result of resuming a copy of it
    made interrupted (its MP2 section gone) and then changed by ``alter(h5)``."""
    record = tmp_path / "altered.h5"
    shutil.copy(water_record, record)
    with h5py.File(record, "r+") as h5:
        e_fresh = float(h5["mp2"].attrs["e_tot"])
        h5.attrs["status"] = "interrupted"
        del h5["mp2"]
        alter(h5)
    resumed = run_cli(*WATER_RECORD_ARGS, "--json", "-o", record)
    assert resumed.code == 0, resumed.err
    return e_fresh, resumed


@pytest.mark.parametrize("change", ["scaled", "other shape"])
def test_stored_orbitals_that_do_not_fit_the_basis_are_not_resumed(change, run_cli, tmp_path,
                                                                    caplog, water_record):
    """An interrupted record whose orbitals are not orthonormal in the molecule's basis (a
    record altered, or written before a basis set's definition changed) or have another
    shape: the run starts again, SCF and pairs (theirs came from those orbitals), with a
    warning; it used to resume on them and give a wrong energy, status complete."""
    def alter(h5):
        coeff = h5["scf/mo_coeff"][()]
        del h5["scf/mo_coeff"]
        h5["scf/mo_coeff"] = coeff * 1.01 if change == "scaled" else coeff[:, :-1]
        h5["checkpoint/sums"][...] = 2 * h5["checkpoint/sums"][()]

    e_fresh, resumed = _resumed_after_altering(run_cli, tmp_path, water_record, alter)
    assert any("starts again" in r.getMessage() for r in caplog.records)
    assert json.loads(resumed.out)["e_tot"] == pytest.approx(e_fresh, abs=1e-10)


def test_non_finite_checkpoint_sums_are_computed_again(run_cli, tmp_path, caplog,
                                                        water_record):
    """A finished pair whose stored sums are NaN (an altered record) is computed again, with
    a warning; it made the energy NaN, reported as an overflow of the SCS scales."""
    def alter(h5):
        sums = h5["checkpoint/sums"][()]
        sums[0] = float("nan")
        h5["checkpoint/sums"][...] = sums

    e_fresh, resumed = _resumed_after_altering(run_cli, tmp_path, water_record, alter)
    assert any("non-finite sums" in r.getMessage() for r in caplog.records)
    assert json.loads(resumed.out)["e_tot"] == pytest.approx(e_fresh, abs=1e-10)


STO3G_WATER_NWCHEM = """BASIS "ao basis" SPHERICAL PRINT
#BASIS SET: (3s) -> [1s]
H    S
      3.42525091             0.15432897
      0.62391373             0.53532814
      0.16885540             0.44463454
#BASIS SET: (6s,3p) -> [2s,1p]
O    S
    130.7093200              0.15432897
     23.8088610              0.53532814
      6.4436083              0.44463454
O    SP
      5.0331513             -0.09996723             0.15591627
      1.1695961              0.39951283             0.60768372
      0.3803890              0.70011547             0.39195739
END
"""


def test_a_basis_file_is_known_by_its_contents(run_cli, tmp_path, monkeypatch):
    """PySCF reads a basis name as a file when one exists. The record kept only the name, so
    a resume after the file was edited mixed two bases' block pairs (1e-6 Eh off) and a batch
    reused the old energy; and a file named like a library basis replaced it unseen."""
    monkeypatch.chdir(tmp_path)
    shutil.copy(molecule_path("water"), "water.xyz")
    basis = tmp_path / "my.nw"
    basis.write_text(STO3G_WATER_NWCHEM)
    args = ("run", "water.xyz", "--basis", "my.nw", "--backend", "torch", "--threads", "1",
            "-o", "w.h5", "--json")
    first = json.loads(run_cli(*args).out)
    first_digest = read_record(tmp_path / "w.h5").groups["input"].attrs["basis_file"]
    assert first_digest.startswith("sha256:")
    assert run_cli(*args, "--resume").code == 0
    basis.write_text(STO3G_WATER_NWCHEM.replace("0.16885540", "0.20000000"))
    refused = run_cli(*args, "--resume")
    assert refused.code == 2 and "complete run with other options" in refused.err
    edited = json.loads(run_cli(*args).out)
    assert abs(edited["e_tot"] - first["e_tot"]) > 1e-4
    edited_digest = read_record(tmp_path / "w.h5").groups["input"].attrs["basis_file"]
    [kept] = tmp_path.glob("w.superseded-*.h5")
    rows = json.loads(run_cli("compare", kept, "w.h5", "--json").out)
    assert rows[1]["differs_in"] == ["basis"]
    # A basis file in a folder names default records by its own name.
    (tmp_path / "bases").mkdir()
    shutil.copy(basis, tmp_path / "bases" / "my.nw")
    batch = run_cli("batch", "water.xyz", "--basis", "bases/my.nw", "--backend", "torch",
                    "--threads", "1", "--out", "out")
    assert batch.code == 0, batch.err
    assert (tmp_path / "out" / "water-my.nw.h5").is_file()
    # A manifest line's basis file is the manifest folder's, as its molecule is: one of that
    # name in the working folder was read instead.
    shutil.copy(molecule_path("water"), tmp_path / "bases" / "water.xyz")
    (tmp_path / "bases" / "my.nw").write_text(STO3G_WATER_NWCHEM)
    (tmp_path / "bases" / "jobs.txt").write_text("water.xyz --basis my.nw\n")
    lined = run_cli("batch", "bases/jobs.txt", "--backend", "torch", "--threads", "1",
                    "--out", "lined", "--json")
    assert lined.code == 0, lined.err
    stored = read_record(json.loads(lined.out)[0]["record"]).groups["input"].attrs
    assert stored["basis_file"] == first_digest != edited_digest
    (tmp_path / "sto-3g").write_text(STO3G_WATER_NWCHEM.replace("0.16885540", "0.3"))
    for option in ("--basis", "--auxbasis"):
        shadowed = run_cli("run", "water.xyz", option, "sto-3g", "-o", "s.h5")
        assert shadowed.code == 2 and "give the file as ./sto-3g" in shadowed.err
    # --ecp too: the library's potentials ran, with the file's digest recorded.
    (tmp_path / "lanl2dz").write_text("notes\n")
    shadowed = run_cli("run", "water.xyz", "--basis", "sto-3g", "--ecp", "lanl2dz", "-o", "s.h5")
    assert shadowed.code == 2 and "give the file as ./lanl2dz" in shadowed.err
    # The default partner too (STO-3G's def2-SVP-JKFIT): read from the file, or, unreadable,
    # swapped for generated functions, it changed the energy by 0.1 Eh under the library name.
    (tmp_path / "sto-3g").unlink()
    (tmp_path / "def2-svp-jkfit").write_text("notes\n")
    shadowed = run_cli("run", "water.xyz", "--basis", "sto-3g", "-o", "s.h5")
    assert shadowed.code == 2 and "default fitting basis 'def2-svp-jkfit'" in shadowed.err
    # A polarised Pople name, which PySCF composes from its library files, too.
    (tmp_path / "6-31g(d,p)").write_text("notes\n")
    shadowed = run_cli("run", "water.xyz", "--basis", "6-31g(d,p)", "--auxbasis", "cc-pvdz-ri",
                       "-o", "s.h5")
    assert shadowed.code == 2 and "give the file as ./6-31g(d,p)" in shadowed.err


def test_a_resumed_run_accounts_for_the_pairs_it_did_not_compute(run_cli, tmp_path):
    """The ledger described only the resuming process: pairs a killed run had computed
    (perhaps on a torch fallback) were counted as the resuming run's executor. They now
    carry the interrupted run's own calls, or, when it was killed before writing them,
    appear as energy calls of an 'unrecorded' executor."""
    record = tmp_path / "w.h5"
    args = ("run", molecule_path("water"), "--basis", "sto-3g", "--backend", "torch",
            "--threads", "1", "--occ-block", "1", "-o", record, "--json")
    assert run_cli(*args).code == 0
    pairs = 5 * 6 // 2
    for keep_ledger, expected in ((True, {"torch-cpu": pairs}), (False, {"unrecorded": pairs})):
        with h5py.File(record, "r+") as h5:
            h5.attrs["status"] = "interrupted"
            del h5["mp2"]
            if not keep_ledger:
                del h5["backend"]
        resumed = json.loads(run_cli(*args).out)
        with h5py.File(record, "r") as h5:
            calls = {key.split(".", 2)[2]: value for key, value in h5["backend"].attrs.items()
                     if key.startswith("calls.mp2_energy.")}
        assert calls == expected
        assert set(expected) <= set(resumed["executors"])
        # The restored SCF keeps the interrupted run's /scf_engine (it was dropped).
        with h5py.File(record, "r") as h5:
            assert any(key.startswith("calls.") for key in h5["scf_engine"].attrs)


def test_a_resumed_run_keeps_the_interrupted_runs_fallback_reasons_as_they_were(run_cli,
                                                                               tmp_path):
    """The interrupted run's fallback reasons were read back as one reason, the text of their
    JSON list: every resumed record said fallback_reasons ["[]"] beside 0 fallbacks, and one
    whose killed run had fallen back gave a reason '["mp2_energy: ..."]'."""
    record = tmp_path / "w.h5"
    args = ("run", molecule_path("water"), "--basis", "sto-3g", "--backend", "torch",
            "--threads", "1", "--occ-block", "1", "-o", record, "--json")
    assert run_cli(*args).code == 0
    reason = "mp2_energy: the kernel failed"
    for group, reasons in (("scf_engine", []), ("backend", [reason])):
        with h5py.File(record, "r+") as h5:
            h5.attrs["status"] = "interrupted"
            if "mp2" in h5:
                del h5["mp2"]
            h5[group].attrs["fallback_reasons"] = json.dumps(reasons)
            h5[group].attrs["fallbacks"] = len(reasons)
        assert run_cli(*args).code == 0
        with h5py.File(record, "r") as h5:
            assert h5.attrs["status"] == "complete"
            assert json.loads(h5[group].attrs["fallback_reasons"]) == reasons
            assert h5[group].attrs["fallbacks"] == len(reasons)


def test_fallback_reasons_that_are_not_a_list_of_text_are_refused(tmp_path):
    from dfmp2.errors import InputError
    from dfmp2.records.ledger import stored_calls
    from dfmp2.records.tree import Node

    node = Node()
    node.group("backend").attrs.update({"fallbacks": 0, "fallback_reasons": "{not json"})
    with pytest.raises(InputError, match="fallback_reasons"):
        stored_calls(node)


def test_a_stored_records_executors_are_read_as_a_list(run_cli, tmp_path):
    """Read back from the file, a record's executors were the text of their JSON list taken
    as one executor: ['["torch-cpu"]']."""
    from dfmp2.records.ledger import executors_of
    from dfmp2.records.tree import read_record

    record = tmp_path / "w.h5"
    assert run_cli("run", molecule_path("water"), "--basis", "sto-3g", "--backend", "torch",
                   "--threads", "1", "-o", record).code == 0
    assert executors_of(read_record(record)) == ["torch-cpu"]
