"""Batch runs (failures recorded, complete records skipped, shards) and `compare`."""
from __future__ import annotations

import errno
import os
import shutil
import csv
import json
import shlex
import subprocess
from pathlib import Path

import h5py
import pytest
from pyscf import scf

from conftest import MOLECULES, pyscf_df_rhf, pyscf_dfmp2_reference, pyscf_molecule, python_exe
from dfmp2.jobs.manifest import without_comment


@pytest.fixture
def batch_inputs(tmp_path):
    broken = tmp_path / "broken.xyz"
    broken.write_text("2\n\nH 0 0 0\nH 0 0 nan\n")
    manifest = tmp_path / "jobs.txt"
    manifest.write_text(f"# bundled molecules and one broken file\n"
                        f"{MOLECULES / 'water.xyz'} --basis sto-3g\n"
                        f"{MOLECULES / 'hydrogen_fluoride.xyz'} --frozen-core\n"
                        f"broken.xyz\n")
    return manifest, tmp_path / "out"


def test_batch_finishes_good_ones_and_fails_the_broken_one(batch_inputs, run_cli):
    manifest, out = batch_inputs
    result = run_cli("batch", manifest, str(MOLECULES / "methane.xyz"), "--basis", "cc-pvdz",
                     "--backend", "torch", "--out", out)
    assert result.code == 1
    assert result.err.startswith("Error: 1 of 4 molecules failed: broken.xyz")
    assert len(result.err.strip().splitlines()) == 1

    with open(out / "summary.csv", newline="") as handle:
        rows = {row["molecule"].rsplit("/", 1)[-1]: row for row in csv.DictReader(handle)}
    assert rows["broken.xyz"]["status"] == "failed" and "not finite" in rows["broken.xyz"]["error"]
    assert rows["water.xyz"]["basis"] == "sto-3g"
    with h5py.File(out / "broken-cc-pvdz.h5", "r") as h5:
        assert h5.attrs["status"] == "failed" and "not finite" in h5.attrs["error"]

    mf = pyscf_df_rhf(pyscf_molecule("hydrogen_fluoride", "cc-pvdz"))
    reference = pyscf_dfmp2_reference(mf, 1)
    assert abs(float(rows["hydrogen_fluoride.xyz"]["e_corr"]) - reference.e_corr) <= 1e-8
    assert json.loads((out / "summary.json").read_text())[0]["status"] == "complete"

    again = run_cli("batch", manifest, str(MOLECULES / "methane.xyz"), "--backend", "torch",
                    "--out", out, "--json")
    statuses = {row["molecule"].rsplit("/", 1)[-1]: row["status"] for row in json.loads(again.out)}
    assert statuses["water.xyz"] == "complete (skipped)"
    assert statuses["methane.xyz"] == "complete (skipped)"
    assert statuses["broken.xyz"] == "failed"


def test_a_calculation_listed_twice_is_computed_once(tmp_path, run_cli):
    """Two listings of one calculation (one through another path to the file, or the basis
    named as PySCF reads it alike: STO-3G, sto3g) share a record: the later ones reuse the
    first's (STO-3G and sto3g were computed twice more, into records of their own). The same
    molecule with other options gets its own record, and a line whose options cannot be read
    names no basis."""
    (tmp_path / "water.xyz").write_text((MOLECULES / "water.xyz").read_text())
    (tmp_path / "link.xyz").symlink_to("water.xyz")
    manifest = tmp_path / "jobs.txt"
    manifest.write_text("water.xyz --basis sto-3g\n"
                        "./water.xyz --basis=sto-3g\n"
                        "water.xyz --basis sto-3g --frozen-core\n"
                        "water.xyz --basis cc-pvtz --no-such-option\n"
                        "link.xyz --basis sto-3g\n"
                        "water.xyz --basis STO-3G\n"
                        "water.xyz --basis sto3g\n")
    out = tmp_path / "out"
    result = run_cli("batch", manifest, "--backend", "torch", "--out", out, "--json")
    assert result.code == 1
    rows = json.loads(result.out)
    assert [row["status"] for row in rows] == ["complete", "complete (skipped)", "complete",
                                               "failed", *["complete (skipped)"] * 3]
    assert rows[0]["record"] == rows[1]["record"] == rows[4]["record"] != rows[2]["record"]
    assert rows[5]["record"] == rows[6]["record"] == rows[0]["record"]
    assert rows[0]["e_tot"] == rows[1]["e_tot"] != rows[2]["e_tot"]
    assert rows[3]["basis"] == "" and "no-such-option" in rows[3]["error"]
    assert sorted(p.name for p in out.glob("*.h5")) == [
        "water-cc-pvdz-line4.h5", "water-sto-3g-0.h5", "water-sto-3g-2.h5"]


def test_listings_that_differ_only_in_how_they_run_share_a_record(tmp_path, run_cli):
    """--memory, --occ-block, --scratch or --resume on one listing change how it runs, not
    its result (a rerun reuses a record made with others): the second listing reuses the
    first's record. They were numbered as two calculations and computed twice, and the one
    left alone in the manifest was renamed and computed a third time."""
    (tmp_path / "h2.xyz").write_text("2\n\nH 0 0 0\nH 0 0 0.74\n")
    (tmp_path / "scratch").mkdir()
    manifest = tmp_path / "jobs.txt"
    manifest.write_text(f"h2.xyz\nh2.xyz --memory 2GB --occ-block 1 --resume "
                        f"--scratch {shlex.quote(str(tmp_path / 'scratch'))}\n")
    out = tmp_path / "out"
    result = run_cli("batch", manifest, "--basis", "sto-3g", "--threads", "1", "--out", out,
                     "--json")
    assert result.code == 0, result.err
    rows = json.loads(result.out)
    assert [row["status"] for row in rows] == ["complete", "complete (skipped)"]
    assert rows[0]["record"] == rows[1]["record"] == str(out / "h2-sto-3g.h5")
    manifest.write_text("h2.xyz --memory 2GB\n")
    again = run_cli("batch", manifest, "--basis", "sto-3g", "--threads", "1", "--out", out,
                    "--json")
    assert [row["status"] for row in json.loads(again.out)] == ["complete (skipped)"]
    assert sorted(p.name for p in out.glob("*.h5")) == ["h2-sto-3g.h5"]


def test_a_line_that_fails_when_it_runs_is_named_so_that_mending_it_renames_nothing(
        tmp_path, run_cli):
    """An impossible charge is found only when the line runs: the line is named (and numbers
    its neighbour) as the calculation it asks for, so once mended in place the neighbour's
    record is reused, not renamed and computed again."""
    (tmp_path / "h2.xyz").write_text("2\n\nH 0 0 0\nH 0 0 0.74\n")
    manifest = tmp_path / "jobs.txt"
    manifest.write_text("h2.xyz --charge 1\nh2.xyz\n")
    out = tmp_path / "out"
    first = run_cli("batch", manifest, "--basis", "sto-3g", "--threads", "1", "--out", out,
                    "--json")
    assert [row["status"] for row in json.loads(first.out)] == ["failed", "complete"]
    manifest.write_text("h2.xyz --charge 1 --spin 1\nh2.xyz\n")
    mended = run_cli("batch", manifest, "--basis", "sto-3g", "--threads", "1", "--out", out,
                     "--json")
    assert mended.code == 0, mended.err
    assert [row["status"] for row in json.loads(mended.out)] == ["complete",
                                                                "complete (skipped)"]
    assert sorted(p.name for p in out.glob("*.h5")) == ["h2-sto-3g-0.h5", "h2-sto-3g-1.h5"]


def test_names_pyscf_loads_as_one_basis_are_one_calculation(tmp_path, run_cli):
    """ano and ano-rcc (aliases of PySCF's ano.dat), and a Pople name that PySCF composes in
    another case (6-31G(d,p), 6-31g(d,p)), are one basis: the later listing, and a later
    batch, reuse the record. They were computed again (ano-rcc into a record of its own, the
    Pople names numbered as two calculations, and the later batch's spelling recomputed)."""
    (tmp_path / "h2.xyz").write_text("2\n\nH 0 0 0\nH 0 0 0.74\n")
    manifest = tmp_path / "jobs.txt"
    # PySCF's own default RI partner of a polarised 6-31G cannot be loaded by PySCF.
    pople = "--auxbasis cc-pvdz-ri --basis"
    manifest.write_text(f"h2.xyz --basis ano\nh2.xyz --basis ANO-RCC\n"
                        f"h2.xyz {pople} '6-31G(d,p)'\nh2.xyz {pople} '6-31g(d,p)'\n")
    out = tmp_path / "out"
    result = run_cli("batch", manifest, "--threads", "1", "--out", out, "--json")
    assert result.code == 0, result.err
    rows = json.loads(result.out)
    assert [row["status"] for row in rows] == ["complete", "complete (skipped)"] * 2
    assert rows[0]["record"] == rows[1]["record"] != rows[2]["record"] == rows[3]["record"]
    manifest.write_text(f"h2.xyz {pople} '6-31G(D,P)'\n")
    again = run_cli("batch", manifest, "--threads", "1", "--out", out, "--json")
    assert [row["status"] for row in json.loads(again.out)] == ["complete (skipped)"]
    assert sorted(p.name for p in out.glob("*.h5")) == ["h2-6-31g(d,p).h5", "h2-ano.h5"]


def test_names_of_one_basis_that_carries_potentials_reuse_one_record(tmp_path, run_cli):
    """stuttgart and stuttgart-rlc (one file, with chlorine's core potential) shared one
    record, but its potentials were compared by the name typed: each listing set the other's
    complete record aside and computed it again, on every run of the batch."""
    (tmp_path / "cl2.xyz").write_text("2\n\nCl 0 0 0\nCl 0 0 1.99\n")
    manifest = tmp_path / "jobs.txt"
    manifest.write_text("cl2.xyz --basis stuttgart\ncl2.xyz --basis stuttgart-rlc\n")
    out = tmp_path / "out"
    first = run_cli("batch", manifest, "--threads", "1", "--out", out, "--json")
    assert [row["status"] for row in json.loads(first.out)] == ["complete",
                                                                "complete (skipped)"]
    again = run_cli("batch", manifest, "--threads", "1", "--out", out, "--json")
    assert [row["status"] for row in json.loads(again.out)] == ["complete (skipped)"] * 2
    assert sorted(p.name for p in out.glob("*.h5")) == ["cl2-stuttgart.h5"]


def test_basis_names_of_other_bases_never_compare_equal(tmp_path, monkeypatch):
    """The names are compared by what PySCF loads, never one basis for another: one file
    with another fitting partner, another polarisation, or a file beside a library name."""
    from dfmp2.input.basis_files import library_name_key, same_basis_name

    def same(a: str, b: str) -> bool:
        return library_name_key(a) == library_name_key(b)

    assert same("ano", "ano-rcc") and same("STO-3G", "sto3g") and same("cc-pVDZ", "ccpvdz")
    assert same("6-311++G(2df,2pd)", "6-311++g(2DF, 2PD)")
    # One library file, but PySCF pairs only 6-31g** with an RI basis.
    assert not same("6-31g**", "6-31gss") and not same("cc-pvdz-pp", "stuttgart_rsc_mdf")
    assert not same("6-31g(d,p)", "6-31g(d)") and not same("6-31g(d,p)", "6-31g**")
    assert not same("6-31g(d,p)", "6-311g(d,p)") and not same("name(d,p)", "NAME(d,p)")
    monkeypatch.chdir(tmp_path)
    (tmp_path / "ano.dat").write_text("# a file of this name\n")
    assert same_basis_name("ano.dat") != same_basis_name("ano")
    assert same_basis_name("ano.dat") == ("file", "ano.dat")


def test_a_failed_lines_record_is_named_by_its_manifest_line(tmp_path, run_cli):
    """The record of a line that cannot run was named after the line's index among the
    batch's items (water-cc-pvdz-line0.h5 for line 3 below, after a comment and a blank
    line), which is no line of the manifest; now by its line number, as the error says, and
    numbered by its index where another manifest's line of that number would share it."""
    (tmp_path / "water.xyz").write_text((MOLECULES / "water.xyz").read_text())
    first, second = tmp_path / "first.txt", tmp_path / "second.txt"
    first.write_text("# two bad lines\n\nwater.xyz --charge x\n")
    second.write_text("water.xyz --no-such-option\n\nwater.xyz --spin y\n")
    out = tmp_path / "out"
    result = run_cli("batch", first, second, "--out", out, "--json")
    assert result.code == 1
    rows = json.loads(result.out)
    assert [row["status"] for row in rows] == ["failed"] * 3
    assert "first.txt, line 3" in rows[0]["error"] and "second.txt, line 1" in rows[1]["error"]
    assert [Path(row["record"]).name for row in rows] == [
        "water-cc-pvdz-line3-0.h5", "water-cc-pvdz-line1.h5", "water-cc-pvdz-line3-2.h5"]
    assert sorted(p.name for p in out.glob("*.h5")) == sorted(
        Path(row["record"]).name for row in rows)


def test_a_line_that_cannot_run_does_not_rename_a_good_lines_record(tmp_path, run_cli):
    """A failed line took the batch's default name, which could be a good line's: the good
    record became water-sto-3g-0.h5, and once the manifest was mended it was named
    water-sto-3g.h5 and computed again."""
    (tmp_path / "water.xyz").write_text((MOLECULES / "water.xyz").read_text())
    manifest = tmp_path / "jobs.txt"
    manifest.write_text("water.xyz\nwater.xyz --xc b2plyp --scs-os 1.5\n")
    out = tmp_path / "out"
    first = run_cli("batch", manifest, "--basis", "sto-3g", "--out", out, "--json")
    assert [row["status"] for row in json.loads(first.out)] == ["complete", "failed"]
    manifest.write_text("water.xyz\n")
    mended = run_cli("batch", manifest, "--basis", "sto-3g", "--out", out, "--json")
    assert mended.code == 0, mended.err
    assert [row["status"] for row in json.loads(mended.out)] == ["complete (skipped)"]
    assert sorted(p.name for p in out.glob("*.h5")) == ["water-sto-3g-line2.h5",
                                                        "water-sto-3g.h5"]


def test_shards_split_the_list(tmp_path, run_cli, monkeypatch):
    inputs = [str(MOLECULES / f"{name}.xyz") for name in ("water", "ammonia", "methane")]
    out = tmp_path / "out"
    first = run_cli("batch", *inputs, "--basis", "sto-3g", "--backend", "torch", "--out", out,
                    "--shard", "0/2", "--json")
    assert first.code == 0, first.err
    assert [r["index"] for r in json.loads(first.out)] == [0, 2]
    monkeypatch.setenv("SLURM_ARRAY_TASK_ID", "1")
    monkeypatch.setenv("SLURM_ARRAY_TASK_COUNT", "2")
    monkeypatch.setenv("SLURM_ARRAY_TASK_MAX", "1")
    second = run_cli("batch", *inputs, "--basis", "sto-3g", "--backend", "torch", "--out", out,
                     "--json")
    assert [r["index"] for r in json.loads(second.out)] == [1]
    assert (out / "summary-shard-1-of-2.csv").exists()
    assert sorted(p.name for p in out.glob("*.h5")) == [
        "ammonia-sto-3g.h5", "methane-sto-3g.h5", "water-sto-3g.h5"]


def test_a_pattern_of_any_depth_of_folders_takes_every_molecule(tmp_path, run_cli):
    """mols/**/*.xyz left out mols/water.xyz (and any molecule two folders down): '**' was
    read as '*', one folder exactly."""
    (tmp_path / "mols" / "more").mkdir(parents=True)
    (tmp_path / "mols" / "water.xyz").write_text((MOLECULES / "water.xyz").read_text())
    (tmp_path / "mols" / "more" / "hf.xyz").write_text(
        (MOLECULES / "hydrogen_fluoride.xyz").read_text())
    # Followed, a link back up listed every molecule forty times over.
    (tmp_path / "mols" / "more" / "up").symlink_to("..")
    result = run_cli("batch", f"{tmp_path}/mols/**/*.xyz", "--basis", "sto-3g", "--threads",
                     "1", "--out", tmp_path / "out", "--json")
    assert result.code == 0, result.err
    listed = json.loads(result.out)
    rows = {Path(row["molecule"]).name: row for row in listed}
    assert sorted(rows) == ["hf.xyz", "water.xyz"] and len(listed) == 2
    for name, molecule in (("water.xyz", "water"), ("hf.xyz", "hydrogen_fluoride")):
        reference = pyscf_dfmp2_reference(pyscf_df_rhf(pyscf_molecule(molecule, "sto-3g")), 0)
        assert abs(rows[name]["e_tot"] - reference.e_tot) <= 1e-8


def test_a_file_whose_name_looks_like_a_pattern_is_that_file(tmp_path, run_cli, monkeypatch):
    """mol[1].xyz given as it is named (quoted, or escaped by a shell's completion) is that
    file: read as a pattern, the batch ran mol1.xyz, another molecule, under its name, or
    failed it as matching no file."""
    monkeypatch.chdir(tmp_path)
    Path("mol[1].xyz").write_text((MOLECULES / "water.xyz").read_text())
    Path("mol1.xyz").write_text((MOLECULES / "hydrogen_fluoride.xyz").read_text())
    result = run_cli("batch", "mol[1].xyz", "--basis", "sto-3g", "--threads", "1", "--out",
                     "out", "--json")
    assert result.code == 0, result.err
    [row] = json.loads(result.out)
    assert row["molecule"] == "mol[1].xyz"
    reference = pyscf_dfmp2_reference(pyscf_df_rhf(pyscf_molecule("water", "sto-3g")), 0)
    assert abs(row["e_corr"] - reference.e_corr) <= 1e-8
    assert abs(row["e_tot"] - reference.e_tot) <= 1e-8


def test_a_pattern_that_matches_nothing_names_its_record_without_its_wildcards(tmp_path,
                                                                              run_cli):
    """The failed line of 'nomatch/*.xyz' left its record as '*-sto-3g-item0.h5': a file
    name that every shell command on the folder reads as a pattern."""
    result = run_cli("batch", f"{tmp_path}/nomatch/*.xyz", MOLECULES / "water.xyz", "--basis",
                     "sto-3g", "--threads", "1", "--out", tmp_path / "out", "--json")
    assert result.code == 1 and "matches no file" in result.err
    names = sorted(p.name for p in (tmp_path / "out").glob("*.h5"))
    assert names == ["_-sto-3g-item0.h5", "water-sto-3g.h5"]
    rows = json.loads(result.out)
    assert [Path(row["record"]).name for row in rows] == names
    reference = pyscf_dfmp2_reference(pyscf_df_rhf(pyscf_molecule("water", "sto-3g")), 0)
    assert abs(rows[1]["e_tot"] - reference.e_tot) <= 1e-8


def test_records_of_names_that_differ_only_in_case_are_numbered(tmp_path, run_cli):
    """gas/CO.xyz and metals/Co.xyz were given CO-sto-3g.h5 and Co-sto-3g.h5: one file on a
    file system that ignores case (macOS's, Windows'), where the second run set the first's
    record aside and the first row named a record holding the other molecule."""
    molecules = {"Mol": "water", "mol": "hydrogen_fluoride"}
    for folder, (stem, name) in zip(("a", "b"), molecules.items()):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / f"{stem}.xyz").write_text((MOLECULES / f"{name}.xyz").read_text())
    result = run_cli("batch", tmp_path / "a" / "Mol.xyz", tmp_path / "b" / "mol.xyz",
                     "--basis", "sto-3g", "--threads", "1", "--out", tmp_path / "out", "--json")
    assert result.code == 0, result.err
    rows = json.loads(result.out)
    assert len({row["record"].casefold() for row in rows}) == 2
    for row, name in zip(rows, molecules.values()):
        reference = pyscf_dfmp2_reference(pyscf_df_rhf(pyscf_molecule(name, "sto-3g")), 0)
        with h5py.File(row["record"], "r") as h5:
            assert abs(h5["mp2"].attrs["e_tot"] - reference.e_tot) <= 1e-8


def test_a_manifest_written_with_a_byte_order_mark_runs_its_first_line(tmp_path, run_cli):
    """A manifest saved as Windows editors save UTF-8 (a byte-order mark, CRLF line ends)
    failed its first line: its molecule's name began with an invisible U+FEFF."""
    (tmp_path / "water.xyz").write_text((MOLECULES / "water.xyz").read_text())
    manifest = tmp_path / "jobs.txt"
    manifest.write_bytes(b"\xef\xbb\xbfwater.xyz --basis sto-3g\r\n")
    result = run_cli("batch", manifest, "--threads", "1", "--out", tmp_path / "out", "--json")
    assert result.code == 0, result.err
    [row] = json.loads(result.out)
    assert row["molecule"] == str(tmp_path / "water.xyz")
    reference = pyscf_dfmp2_reference(pyscf_df_rhf(pyscf_molecule("water", "sto-3g")), 0)
    assert abs(row["e_tot"] - reference.e_tot) <= 1e-8


def test_a_summary_that_cannot_be_written_still_shows_the_batchs_results(tmp_path, run_cli,
                                                                         monkeypatch):
    """A full disk at the summary ended the batch in its error line alone: the rows of the
    molecules it had computed were never printed, and --json printed nothing."""
    real_open = os.open

    def full_disk_at_the_summary(path, flags, mode=0o777, **options):
        if Path(path).name.startswith((".summary.csv.", ".summary.json.")):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))
        return real_open(path, flags, mode, **options)

    monkeypatch.setattr(os, "open", full_disk_at_the_summary)
    result = run_cli("batch", MOLECULES / "water.xyz", "--basis", "sto-3g", "--threads", "1",
                     "--out", tmp_path / "out", "--json")
    assert result.code == 1
    [error] = result.err.strip().splitlines()
    assert error.startswith("Error: cannot write the batch summary") and \
        "No space left on device" in error
    [row] = json.loads(result.out)
    reference = pyscf_dfmp2_reference(pyscf_df_rhf(pyscf_molecule("water", "sto-3g")), 0)
    assert row["status"] == "complete"
    assert abs(row["e_tot"] - reference.e_tot) <= 1e-8


def test_output_options_on_a_manifest_line_fail_that_line_only(tmp_path, run_cli):
    """--qcschema on a line ended the whole batch in a TypeError traceback, before any
    molecule ran."""
    manifest = tmp_path / "jobs.txt"
    water = MOLECULES / "water.xyz"
    manifest.write_text(f"{water} --basis sto-3g\n{water} --basis sto-3g --qcschema\n"
                        f"{water} --basis sto-3g --qcschema-version 2\n"
                        f"{water} --basis sto-3g --json -o x.h5\n")
    result = run_cli("batch", manifest, "--backend", "torch", "--out", tmp_path / "out",
                     "--json")
    assert result.code == 1
    rows = json.loads(result.out)
    assert [row["status"] for row in rows] == ["complete", "failed", "failed", "failed"]
    assert [row["error"].split(": ", 1)[1] for row in rows[1:]] == [
        "--qcschema is chosen by the batch, not per molecule",
        "--qcschema-version is chosen by the batch, not per molecule",
        "--json, --output are chosen by the batch, not per molecule"]


def test_compare_records_and_pyscf(tmp_path, run_cli):
    a, b = tmp_path / "a.h5", tmp_path / "b.h5"
    assert run_cli("run", MOLECULES / "water.xyz", "--backend", "torch", "-o", a).code == 0
    assert run_cli("run", MOLECULES / "water.xyz", "--backend", "torch", "--fused-energy",
                   "--precision", "fp32", "-o", b).code == 0
    result = run_cli("compare", a, b, "--json")
    assert result.code == 0, result.err
    rows = json.loads(result.out)
    assert rows[0]["delta_e_corr"] is None
    assert 0 < abs(rows[1]["delta_e_corr"]) <= 1e-6
    assert rows[1]["differs_in"] == [] and rows[1]["basis"] == "cc-pvdz"
    against_pyscf = json.loads(run_cli("compare", a, "--reference", "pyscf", "--json").out)
    reference = pyscf_dfmp2_reference(pyscf_df_rhf(pyscf_molecule("water", "cc-pvdz")), 0)
    assert abs(against_pyscf[0]["delta_e_corr"]) <= 1e-8
    assert abs(against_pyscf[0]["e_corr"] - reference.e_corr) <= 1e-8


def test_compare_says_which_rows_are_other_calculations(tmp_path, run_cli):
    """A frozen core, another molecule and another basis were put beside the reference with
    their energy differences as if they were discrepancies, and nothing said so."""
    # The same water written with other digits and comment (as QCSchema's repr writes it).
    lines = (MOLECULES / "water.xyz").read_text().splitlines()
    rewritten = tmp_path / "rewritten.xyz"
    rewritten.write_text("\n".join(lines[:1] + ["same water"] + [
        f"{symbol} " + " ".join(repr(float(x)) + "000" for x in rest)
        for symbol, *rest in (line.split() for line in lines[2:])]) + "\n")
    records = {}
    for name, args in (("ref", ("water",)), ("fc", ("water", "--frozen-core")),
                       ("hf", ("hydrogen_fluoride",)), ("631", ("water", "--basis", "6-31g")),
                       ("same", (rewritten, "--backend", "nki"))):
        molecule, *options = args
        records[name] = tmp_path / f"{name}.h5"
        basis = () if "--basis" in options else ("--basis", "sto-3g")
        backend = () if "--backend" in options else ("--backend", "torch")
        path = molecule if isinstance(molecule, Path) else MOLECULES / f"{molecule}.xyz"
        assert run_cli("run", path, *basis, *options, *backend, "-o", records[name]).code == 0
    result = run_cli("compare", *records.values(), "--json")
    assert result.code == 0, result.err
    assert [row["differs_in"] for row in json.loads(result.out)] == [
        [], ["frozen"], ["atoms"], ["basis", "auxbasis", "jk-auxbasis"], []]
    table = run_cli("compare", *records.values())
    assert f"{records['fc']}: other frozen" in table.out
    assert f"{records['631']}: other basis, auxbasis, jk-auxbasis" in table.out


def test_a_record_with_a_non_finite_energy_is_refused_as_altered(tmp_path, run_cli):
    """compare --json printed NaN and Infinity (not JSON) with status 0, and show printed
    them under 'status complete'."""
    record = tmp_path / "w.h5"
    assert run_cli("run", MOLECULES / "water.xyz", "--basis", "sto-3g", "--backend", "torch",
                   "-o", record).code == 0
    with h5py.File(record, "r+") as h5:
        h5["mp2"].attrs["e_corr"] = float("nan")
    for command in (("compare", record, "--json"), ("show", record)):
        result = run_cli(*command)
        assert result.code == 2 and result.out == ""
        assert "/mp2 e_corr holds nan, not a finite energy" in result.err


def test_records_of_energies_no_molecule_has_are_refused_as_altered(tmp_path, run_cli,
                                                                      water_record):
    """Finite energies whose difference overflows (+-1.7e308 Eh in two altered records)
    ended compare --json in a ValueError traceback, and its table showed -inf."""
    records = []
    for name, energy in (("high.h5", 1.7e308), ("low.h5", -1.7e308)):
        records.append(tmp_path / name)
        shutil.copy(water_record, records[-1])
        with h5py.File(records[-1], "r+") as h5:
            h5["mp2"].attrs["e_tot"] = energy
    for command in (("compare", *records, "--json"), ("compare", *records)):
        result = run_cli(*command)
        assert result.code == 2 and result.out == ""
        [error] = result.err.strip().splitlines()
        assert "/mp2 e_tot holds 1.7e+308, not a finite energy" in error


def test_batch_accepts_dimers(tmp_path, run_cli):
    manifest = tmp_path / "dimers.txt"
    # Trailing comments as in the README's example, which used to fail their lines ("Got
    # unexpected extra arguments").
    manifest.write_text(f"{MOLECULES / 'water_dimer.xyz'} --split 3 --basis sto-3g   # a dimer\n"
                        f"{MOLECULES / 'water.xyz'} --basis sto-3g #monomer\n")
    out = tmp_path / "out"
    result = run_cli("batch", manifest, "--backend", "torch", "--out", out, "--json")
    assert result.code == 0, result.err
    rows = json.loads(result.out)
    assert rows[0]["record"].endswith("water_dimer-sto-3g-interaction.h5")
    with h5py.File(rows[0]["record"], "r") as h5:
        assert h5.attrs["schema"] == "dfmp2.interaction/1"
        assert h5["interaction"].attrs["e_int_mp2_cp"] == pytest.approx(rows[0]["e_int_mp2_cp"])
    assert "e_int_mp2_cp" not in rows[1] and rows[1]["basis"] == "sto-3g"


@pytest.mark.parametrize("line,tokens", [
    ("w.xyz --basis sto-3g  # note", ["w.xyz", "--basis", "sto-3g"]),
    ("a#1.xyz --frozen-core", ["a#1.xyz", "--frozen-core"]),
    ('"x # y.xyz" --basis sto-3g # note', ["x # y.xyz", "--basis", "sto-3g"]),
    ("'it''s # x' # note", ["its # x"]),
    ("a\\ #b.xyz #note", ["a #b.xyz"]),
])
def test_manifest_comments_start_a_word_outside_quotes_as_in_a_shell(line, tokens):
    assert shlex.split(without_comment(line)) == tokens


def test_a_failed_check_stays_failed_when_the_batch_reuses_its_record(run_cli, tmp_path):
    """A record whose --check disagreed with PySCF was reported 'complete (check failed)' once,
    then 'complete (skipped)' on every rerun; and a batch with a disagreement exited 0, where
    `dfmp2 run --check` exits 1."""
    args = ("batch", MOLECULES / "water.xyz", "--basis", "sto-3g", "--backend", "torch",
            "--threads", "1", "--check", "--out", tmp_path / "out", "--json")
    first = run_cli(*args)
    assert first.code == 0, first.err
    assert json.loads(first.out)[0]["status"] == "complete"
    record = Path(json.loads(first.out)[0]["record"])
    with h5py.File(record, "r+") as h5:
        h5["reference"].attrs["passed"] = False
    again = run_cli(*args)
    assert again.code == 1 and "disagree with PySCF beyond the --check tolerance" in again.err
    assert json.loads(again.out)[0]["status"] == "complete (check failed)"


def test_a_manifest_lines_frozen_count_overrides_a_batch_wide_frozen_core(run_cli, tmp_path):
    """'water.xyz --frozen 0' under 'batch --frozen-core' was refused as giving both, though
    options on a line override the batch's."""
    manifest = tmp_path / "jobs.txt"
    manifest.write_text(f"{MOLECULES / 'water.xyz'} --frozen 0\n{MOLECULES / 'water.xyz'}\n")
    result = run_cli("batch", manifest, "--basis", "sto-3g", "--backend", "torch", "--threads",
                     "1", "--frozen-core", "--out", tmp_path / "out", "--json")
    assert result.code == 0, result.err
    rows = json.loads(result.out)
    frozen = [h5py.File(row["record"], "r")["input"].attrs["frozen"] for row in rows]
    assert frozen == [0, 1]


def test_an_unfinished_record_of_a_lines_earlier_options_is_moved_aside(run_cli, tmp_path):
    """A molecule interrupted in a batch, whose manifest line was then changed, failed on
    every rerun ('choose another -o', which a batch line cannot); the batch now follows its
    manifest and keeps the unfinished record beside the new one."""
    manifest = tmp_path / "jobs.txt"
    manifest.write_text(f"{MOLECULES / 'water.xyz'} --basis sto-3g\n")
    args = ("batch", manifest, "--backend", "torch", "--threads", "1", "--out",
            tmp_path / "out", "--json")
    record = Path(json.loads(run_cli(*args).out)[0]["record"])
    with h5py.File(record, "r+") as h5:
        h5.attrs["status"] = "interrupted"
    manifest.write_text(f"{MOLECULES / 'water.xyz'} --basis sto-3g --frozen-core\n")
    again = run_cli(*args)
    assert again.code == 0, again.err
    assert json.loads(again.out)[0]["status"] == "complete"
    [kept] = (tmp_path / "out").glob("water-sto-3g.unfinished-*.h5")
    with h5py.File(kept, "r") as h5:
        assert h5.attrs["status"] == "interrupted" and h5["input"].attrs["frozen"] == 0


def test_compare_shows_hostile_record_names_on_one_line_each(run_cli, tmp_path, water_record):
    """A line break in a record's name was printed raw in compare's table: the row broke in
    two, and a name could forge a row."""
    names = [tmp_path / "a\nb.h5", tmp_path / "r\x1b[31m.h5"]
    for name in names:
        shutil.copy(water_record, name)
    result = run_cli("compare", *names)
    assert result.code == 0, result.err
    rows = result.out.strip().splitlines()
    assert len(rows) == 3, result.out
    assert "a\\nb.h5" in rows[1] and "r\\x1b[31m.h5" in rows[2] and "\x1b" not in result.out


def test_a_batch_lines_output_errors_name_the_batchs_out_option(run_cli, tmp_path):
    """A file in --out that is not a record, where a line's record goes, failed the line
    with 'choose another -o path', an option a batch does not have."""
    out = tmp_path / "out"
    out.mkdir()
    (out / "water-sto-3g.h5").write_text("not a record\n")
    manifest = tmp_path / "jobs.txt"
    manifest.write_text(f"{MOLECULES / 'water.xyz'} --basis sto-3g\n")
    result = run_cli("batch", manifest, "--backend", "torch", "--threads", "1", "--out", out,
                     "--json")
    [row] = json.loads(result.out)
    assert row["status"] == "failed"
    assert "choose another --out path" in row["error"] and "-o " not in row["error"]


def test_compare_with_pyscf_refuses_a_basis_file_changed_since_the_run(run_cli, tmp_path,
                                                                         monkeypatch):
    """compare --reference pyscf read the record's basis file again by its name, without its
    recorded digest: after the file was edited (or from a folder holding another file of
    that name) it showed dfmp2 0.7 Eh off PySCF, exit 0; where no such file was, 'unknown
    basis'."""
    import pyscf

    library = Path(pyscf.__file__).parent / "gto" / "basis"
    monkeypatch.chdir(tmp_path)
    shutil.copy(library / "sto-3g.dat", "mine.nw")
    args = ("--auxbasis", "def2-svp-ri", "--jk-auxbasis", "def2-universal-jkfit")
    result = run_cli("run", MOLECULES / "water.xyz", "--basis", "./mine.nw", *args,
                     "--threads", "1", "-o", "w.h5")
    assert result.code == 0, result.err
    same = run_cli("compare", "w.h5", "--reference", "pyscf")
    assert same.code == 0, same.err
    # The PySCF row is PySCF's own SCF in the library's STO-3G, the file's contents.
    mf = scf.RHF(pyscf_molecule("water", "sto-3g")).density_fit(auxbasis="def2-universal-jkfit")
    mf.conv_tol, mf.verbose = 1e-12, 0
    fields = same.out.splitlines()[-1].split()
    assert float(fields[4]) == pytest.approx(mf.kernel(), abs=1e-8)
    assert abs(float(fields[-4])) < 1e-8
    shutil.copy(library / "sto-6g.dat", "mine.nw")
    edited = run_cli("compare", "w.h5", "--reference", "pyscf")
    assert edited.code == 2 and "Error: w.h5 was computed with the basis file ./mine.nw, " \
        "which holds other contents now" in edited.err
    Path("mine.nw").unlink()
    gone = run_cli("compare", "w.h5", "--reference", "pyscf")
    assert gone.code == 2 and "which is not in this folder" in gone.err


def test_a_folder_at_the_summarys_name_is_refused_before_any_molecule(run_cli, tmp_path):
    """It failed the batch only after every molecule was computed, without the table."""
    out = tmp_path / "out"
    (out / "summary.json").mkdir(parents=True)
    result = run_cli("batch", MOLECULES / "water.xyz", "--basis", "sto-3g", "--threads", "1",
                     "--out", out)
    assert result.code == 2 and "summary.json is a folder, where the batch writes its " \
        "summary" in result.err
    assert sorted(p.name for p in out.iterdir()) == ["summary.json"]


@pytest.mark.parametrize("fed_by", ["a pipe", "a redirected file"])
def test_a_batch_given_standard_input_says_how_to_give_its_list(fed_by, tmp_path):
    """`dfmp2 batch /dev/stdin` fed by a pipe made one failed line, 'not a regular file', and a
    failed record; fed by a redirected list, it looked every molecule up in /dev. Now one
    line, status 2, and nothing written."""
    (tmp_path / "h2.xyz").write_text("2\n\nH 0 0 0\nH 0 0 0.74\n")
    (tmp_path / "jobs.txt").write_text("h2.xyz\n")
    command = [python_exe(), "-m", "dfmp2", "batch", "/dev/stdin", "--out", "out"]
    if fed_by == "a pipe":
        proc = subprocess.run(command, input="h2.xyz\n", capture_output=True, text=True,
                              cwd=tmp_path, timeout=120)
    else:
        with open(tmp_path / "jobs.txt") as list_file:
            proc = subprocess.run(command, stdin=list_file, capture_output=True, text=True,
                                  cwd=tmp_path, timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.splitlines() == [
        "Error: /dev/stdin is standard input, which dfmp2 batch does not read (each rank reads "
        "the list itself, and a list's paths are relative to its folder); give the list's own "
        "file (dfmp2 batch jobs.txt) or the XYZ files, or pipe one molecule to dfmp2 run "
        "/dev/stdin"]
    assert proc.stdout == "" and not (tmp_path / "out").exists()
    # A link to the list itself, given with that list on standard input, is the list's file
    # (it was refused as standard input).
    (tmp_path / "link.txt").symlink_to(tmp_path / "jobs.txt")
    with open(tmp_path / "jobs.txt") as list_file:
        linked = subprocess.run([python_exe(), "-m", "dfmp2", "batch", "link.txt", "--basis",
                                 "sto-3g", "--threads", "1", "--out", "out"], stdin=list_file,
                                capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert linked.returncode == 0, linked.stderr
