"""Batch shards from Slurm arrays (every task runs its own molecules, together all of them once),
and batches that meet another run's record lock (issue 18, points 2 and 12)."""
from __future__ import annotations

import csv
import json
import os
import signal

import pytest

from dfmp2.jobs.batch import RUNNING_ELSEWHERE, ordinal, parse_shard
from dfmp2.errors import InputError
from dfmp2.records.tree import (FAILED, SCHEMA, new_record, read_record, set_status, status,
                                write_record)
from dfmp2.records.lock import RecordLock

SLURM_ARRAY_VARIABLES = ("SLURM_ARRAY_TASK_ID", "SLURM_ARRAY_TASK_COUNT", "SLURM_ARRAY_TASK_MIN",
                         "SLURM_ARRAY_TASK_MAX", "SLURM_ARRAY_TASK_STEP")
# sbatch --array forms and the task ids Slurm gives their tasks.
REGULAR_ARRAYS = {"0-3": (range(0, 4), 1), "1-4": (range(1, 5), 1),
                  "0-15:5": (range(0, 16, 5), 5)}


def slurm_environment(ids: list[int], task: int, step: int | None) -> dict[str, str]:
    """What Slurm sets in the task ``task`` of an array with ``ids``."""
    environ = {"SLURM_ARRAY_TASK_ID": str(task), "SLURM_ARRAY_TASK_COUNT": str(len(ids)),
               "SLURM_ARRAY_TASK_MIN": str(min(ids)), "SLURM_ARRAY_TASK_MAX": str(max(ids))}
    if step is not None:
        environ["SLURM_ARRAY_TASK_STEP"] = str(step)
    return environ


@pytest.fixture
def no_slurm_array(monkeypatch):
    """Tests that set the array themselves must not inherit one from a Slurm job running them."""
    for name in SLURM_ARRAY_VARIABLES:
        monkeypatch.delenv(name, raising=False)


@pytest.mark.parametrize("form", REGULAR_ARRAYS)
@pytest.mark.parametrize("molecules", [1, 4, 7])
def test_every_task_of_an_array_has_its_own_molecules(form, molecules):
    ids, step = REGULAR_ARRAYS[form]
    shards = [parse_shard(None, slurm_environment(list(ids), task, step)) for task in ids]
    assert sorted(shards) == [(k, len(ids)) for k in range(len(ids))]
    runs = [index for k, n in shards for index in range(molecules) if index % n == k]
    assert sorted(runs) == list(range(molecules))


@pytest.mark.parametrize("environ", [
    {"SLURM_ARRAY_TASK_ID": "7", "SLURM_ARRAY_TASK_COUNT": "3"},
    {"SLURM_ARRAY_TASK_ID": "7", "SLURM_ARRAY_TASK_COUNT": "3", "SLURM_ARRAY_TASK_MIN": "3"},
], ids=["no min", "no max"])
def test_an_array_without_min_or_max_still_refuses_a_task_beyond_it(environ):
    with pytest.raises(InputError, match="--shard K/N"):
        parse_shard(None, environ)


def test_an_array_without_max_is_refused_in_every_task():
    """--array=0,1,2,4 without SLURM_ARRAY_TASK_MAX (which Slurm always sets): tasks 0, 1
    and 2 took shards 0-2 of 4, only task 4 was refused, and molecule 3 ran nowhere."""
    for task in (0, 1, 2, 4):
        environ = {"SLURM_ARRAY_TASK_ID": str(task), "SLURM_ARRAY_TASK_COUNT": "4",
                   "SLURM_ARRAY_TASK_MIN": "0", "SLURM_ARRAY_TASK_STEP": "1"}
        with pytest.raises(InputError, match="SLURM_ARRAY_TASK_MAX is not"):
            parse_shard(None, environ)
        with pytest.raises(InputError, match="SLURM_ARRAY_TASK_MAX is not"):
            parse_shard("array", environ)


def test_batch_takes_shard_array_as_frequencies_does():
    """`--shard array` was refused by batch ("write it as K/N"), though frequencies takes it
    and the README says it works as batch does."""
    environ = slurm_environment([4, 5, 6], 5, 1)
    assert parse_shard("array", environ) == parse_shard(None, environ) == (1, 3)
    assert parse_shard("array", environ, rank=1, world_size=2) == (4, 6)
    with pytest.raises(InputError, match="not a task of a Slurm array"):
        parse_shard("array", {})


@pytest.mark.parametrize("step", [None, 1, 2, 4], ids=lambda s: f"step {s}")
def test_an_irregular_array_is_refused_in_every_task(step):
    ids = [3, 7, 9]  # sbatch --array=3,7,9
    for task in ids:
        with pytest.raises(InputError) as refused:
            parse_shard(None, slurm_environment(ids, task, step))
        message = str(refused.value)
        assert f"Slurm array task {task} is not at a regular position" in message
        assert message.endswith("give the shard explicitly with --shard K/N")


@pytest.mark.parametrize("task", [-5, 1, 20], ids=["before", "between", "after"])
def test_a_task_id_off_the_array_is_refused(task):
    with pytest.raises(InputError, match=f"task {task} is not at a regular position"):
        parse_shard(None, slurm_environment([0, 5, 10, 15], task, 5))


@pytest.mark.parametrize("name,value", [("SLURM_ARRAY_TASK_ID", "x"),
                                        ("SLURM_ARRAY_TASK_COUNT", "four"),
                                        ("SLURM_ARRAY_TASK_MIN", ""),
                                        ("SLURM_ARRAY_TASK_MAX", "15.0"),
                                        ("SLURM_ARRAY_TASK_STEP", "5x"),
                                        ("SLURM_ARRAY_TASK_STEP", "1_0")])
def test_junk_in_an_array_variable_is_an_input_error(name, value):
    environ = {**slurm_environment([0, 5, 10, 15], 5, 5), name: value}
    with pytest.raises(InputError, match=f"{name}={value!r} is not a whole number"):
        parse_shard(None, environ)


def test_an_explicit_shard_wins_over_the_array():
    environ = slurm_environment([3, 7, 9], 7, None)
    assert parse_shard("1/2", environ) == (1, 2)
    assert parse_shard(None, {}) == (0, 1)


def test_the_shard_an_array_task_takes_by_default_is_said(caplog):
    """A task given a list of its own ran a third of it and reported success, without a
    word on stderr."""
    environ = slurm_environment([0, 1, 2], 2, 1)
    assert parse_shard(None, environ) == (2, 3)
    assert "runs shard 2/3 of the batch (every 3rd molecule from the 3rd)" in caplog.text
    assert "give --shard 0/1 to run all of them" in caplog.text
    caplog.clear()
    parse_shard("array", environ)
    assert not caplog.text


def test_ordinals_are_english():
    """The warning above read 'every 3-th molecule from the 2-th'."""
    assert [ordinal(n) for n in (1, 2, 3, 4, 11, 12, 13, 21, 22, 101, 111)] == [
        "1st", "2nd", "3rd", "4th", "11th", "12th", "13th", "21st", "22nd", "101st", "111th"]


@pytest.mark.parametrize("form", REGULAR_ARRAYS)
def test_ranks_split_their_task_s_shard(form):
    """srun -n R inside each task of an array (or torchrun under --shard K/N): the ranks of a
    task take that task's molecules between them, and all the processes of all the tasks
    take every molecule once (before, the ranks ran every molecule in every task)."""
    ids, step = REGULAR_ARRAYS[form]
    molecules, taken = range(23), []
    for task in ids:
        for rank in range(3):
            k, n = parse_shard(None, slurm_environment(list(ids), task, step), rank, 3)
            taken += list(molecules[k::n])
    assert sorted(taken) == list(molecules)
    assert parse_shard("1/2", {}, rank=2, world_size=3) == (5, 6)
    assert parse_shard(None, {}, rank=1, world_size=3) == (1, 3)


def test_shards_run_with_other_numbers_of_ranks_take_every_molecule_once():
    """Shard 0/2 on two ranks and shard 1/2 in one process: molecules 2, 6, 10, ... were run
    by no one, and 1, 5, 9, ... twice, each command exiting 0."""
    molecules, taken = range(23), []
    for text, ranks in (("0/2", 2), ("1/2", 1)):
        for rank in range(ranks):
            k, n = parse_shard(text, {}, rank, ranks)
            taken += list(molecules[k::n])
    assert sorted(taken) == list(molecules)


@pytest.fixture
def hydrogens(tmp_path):
    """Four tiny molecules, each with its own record name."""
    paths = []
    for n, bond in enumerate((0.70, 0.74, 0.78, 0.82)):
        path = tmp_path / f"h2_{n}.xyz"
        path.write_text(f"2\ncharge=0 multiplicity=1\nH 0 0 0\nH 0 0 {bond}\n")
        paths.append(path)
    return paths


def run_batch(run_cli, molecules, out, *extra):
    return run_cli("batch", *molecules, "--basis", "sto-3g", "--backend", "torch", "--out", out,
                   *extra)


@pytest.mark.parametrize("form", REGULAR_ARRAYS)
def test_an_array_job_runs_every_molecule_once(form, hydrogens, tmp_path, run_cli, monkeypatch,
                                               no_slurm_array):
    ids, step = REGULAR_ARRAYS[form]
    out = tmp_path / "out"
    ran = []
    for task in ids:
        for name, value in slurm_environment(list(ids), task, step).items():
            monkeypatch.setenv(name, value)
        result = run_batch(run_cli, hydrogens, out, "--json")
        assert result.code == 0, result.err
        rows = json.loads(result.out)
        assert [row["status"] for row in rows] == ["complete"] * len(rows)
        ran += [row["index"] for row in rows]
    assert sorted(ran) == list(range(len(hydrogens)))
    count = len(ids)
    assert sorted(p.name for p in out.glob("summary-*.csv")) == sorted(
        f"summary-shard-{k}-of-{count}.csv" for k in range(count))
    assert all(status(read_record(out / f"{p.stem}-sto-3g.h5")) == "complete" for p in hydrogens)


def test_a_batch_in_a_slurm_scripts_own_shell_runs_every_molecule(hydrogens, tmp_path, run_cli,
                                                                   no_slurm_array,
                                                                   slurm_batch_shell):
    """`dfmp2 batch` called in an sbatch script of 4 tasks without srun: one process with
    every molecule (it was taken for rank 0 of 4 and ran only the first of every four)."""
    out = tmp_path / "out"
    result = run_batch(run_cli, hydrogens, out, "--json")
    assert result.code == 0, result.err
    rows = json.loads(result.out)
    assert sorted(row["index"] for row in rows) == list(range(len(hydrogens)))
    assert [row["status"] for row in rows] == ["complete"] * len(hydrogens)
    assert (out / "summary.csv").exists() and not list(out.glob("summary-shard-*"))


def test_an_irregular_array_runs_nothing(hydrogens, tmp_path, run_cli, monkeypatch,
                                         no_slurm_array):
    for name, value in slurm_environment([3, 7, 9], 7, 1).items():
        monkeypatch.setenv(name, value)
    result = run_batch(run_cli, hydrogens, tmp_path / "out")
    assert result.code == 2
    assert result.err.strip().splitlines() == [
        "Error: Slurm array task 7 is not at a regular position of the array (min 3, step 1, "
        "count 3, max 9); give the shard explicitly with --shard K/N"]
    assert not (tmp_path / "out").exists()


def summary_rows(out) -> dict[str, dict]:
    with open(out / "summary.csv", newline="") as handle:
        return {row["molecule"].rsplit("/", 1)[-1]: row for row in csv.DictReader(handle)}


def assert_summary_agrees_with_records(out):
    """Every row says what its record on disk says."""
    for name, row in summary_rows(out).items():
        record = out / row["record"].rsplit("/", 1)[-1]
        on_disk = status(read_record(record)) if record.exists() else None
        if row["status"] == RUNNING_ELSEWHERE:
            assert on_disk in (None, "running"), name
        else:
            assert row["status"].split(" ")[0] == on_disk, (name, row["status"], on_disk)


def test_a_record_another_run_holds_is_left_to_it(hydrogens, tmp_path, run_cli, no_slurm_array):
    out = tmp_path / "out"
    out.mkdir()
    held = out / "h2_1-sto-3g.h5"
    with RecordLock(held):
        result = run_batch(run_cli, hydrogens, out)
    assert result.code == 0, result.err
    assert "left to another dfmp2 run that held their records: h2_1.xyz" in result.out
    rows = summary_rows(out)
    assert rows["h2_1.xyz"]["status"] == RUNNING_ELSEWHERE
    assert "in use by another dfmp2 run" in rows["h2_1.xyz"]["error"]
    assert {rows[f"h2_{n}.xyz"]["status"] for n in (0, 2, 3)} == {"complete"}
    assert not held.exists(), "no failed record for a molecule another run holds"
    assert_summary_agrees_with_records(out)

    # The other run has finished the record by the time this batch writes its summary.
    assert run_batch(run_cli, hydrogens[1:2], tmp_path / "elsewhere").code == 0
    (tmp_path / "elsewhere" / held.name).rename(held)
    with RecordLock(held):
        again = run_batch(run_cli, hydrogens, out, "--json")
    assert again.code == 0, again.err
    row = {r["molecule"].rsplit("/", 1)[-1]: r for r in json.loads(again.out)}["h2_1.xyz"]
    assert row["status"] == "complete (other run)" and row["error"] == ""
    assert row["e_corr"] == json.loads(
        (tmp_path / "elsewhere" / "summary.json").read_text())[0]["e_corr"]
    assert summary_rows(out)["h2_1.xyz"]["status"] == "complete (other run)"
    assert_summary_agrees_with_records(out)


def test_another_runs_record_of_other_inputs_is_not_this_molecules_result(hydrogens, tmp_path,
                                                                          run_cli,
                                                                          no_slurm_array):
    """Two batches on one --out with other options: the one that found the record in use
    reported the other's energy as its own ('complete (other run)', exit 0)."""
    out = tmp_path / "out"
    out.mkdir()
    held = out / "h2_1-sto-3g.h5"
    assert run_batch(run_cli, hydrogens[1:2], tmp_path / "other", "--scs-os", "1.1").code == 0
    (tmp_path / "other" / held.name).rename(held)
    with RecordLock(held):
        result = run_batch(run_cli, hydrogens[:2], out, "--json")
    assert result.code == 1 and "1 of 2 molecules failed: h2_1.xyz" in result.err
    rows = {r["molecule"].rsplit("/", 1)[-1]: r for r in json.loads(result.out)}
    assert rows["h2_0.xyz"]["status"] == "complete"
    assert rows["h2_1.xyz"]["status"] == "failed" and "e_corr" not in rows["h2_1.xyz"]
    assert "holds another run's calculation of other inputs" in rows["h2_1.xyz"]["error"]


def test_a_failure_of_the_other_run_is_its_own(hydrogens, tmp_path, run_cli, no_slurm_array):
    out = tmp_path / "out"
    out.mkdir()
    held = out / "h2_0-sto-3g.h5"
    with RecordLock(held):
        root = new_record(SCHEMA, "dfmp2 batch", {})
        set_status(root, FAILED, "out of memory")
        write_record(held, root)
        result = run_batch(run_cli, hydrogens[:2], out, "--json")
    assert result.code == 0, result.err
    rows = json.loads(result.out)
    assert (rows[0]["status"], rows[0]["error"]) == ("failed (other run)", "out of memory")
    assert rows[1]["status"] == "complete"
    assert_summary_agrees_with_records(out)


def test_no_failed_record_under_another_runs_lock(tmp_path, run_cli, no_slurm_array):
    out = tmp_path / "out"
    out.mkdir()
    broken = tmp_path / "broken.xyz"
    broken.write_text("2\n\nH 0 0 0\nH 0 0 nan\n")
    with RecordLock(out / "broken-sto-3g.h5"):
        result = run_batch(run_cli, [broken], out)
    assert result.code == 1 and "not finite" in result.err
    assert not (out / "broken-sto-3g.h5").exists()
    assert summary_rows(out)["broken.xyz"]["status"] == "failed"
    assert not list(out.glob(".*.tmp"))


def test_a_signal_stops_the_batch(hydrogens, tmp_path, run_cli, monkeypatch, no_slurm_array):
    """SIGTERM during the second of four molecules (the run raises what the signal handler
    raises): the batch stops there with 143, the summaries say complete, interrupted, not
    started, not started, and no record is written for the molecules never started (they all
    used to be started in turn, each interrupted at once and reported failed, exit 1)."""
    from dfmp2.errors import Interrupted
    from dfmp2.jobs import run as run_job

    real_run, calls = run_job.run, []

    def run_until_the_signal(settings, **kwargs):
        calls.append(settings.molecule)
        if len(calls) == 2:
            raise Interrupted("terminated by signal SIGTERM; what was finished is in the "
                              "record, and rerunning the same command resumes it", 143)
        return real_run(settings, **kwargs)

    monkeypatch.setattr(run_job, "run", run_until_the_signal)
    out = tmp_path / "out"
    result = run_batch(run_cli, hydrogens, out, "--json")
    assert result.code == 143
    assert result.err.strip().splitlines()[-1].startswith("Error: terminated by signal SIGTERM")
    assert len(calls) == 2
    rows = json.loads((out / "summary.json").read_text())
    assert [row["status"] for row in rows] == ["complete", "interrupted", "not started",
                                              "not started"]
    assert sorted(path.name for path in out.glob("*.h5")) == ["h2_0-sto-3g.h5"]


def _signal_on_second_call(monkeypatch, module, name: str) -> list:
    """``module.name`` sends this process SIGTERM (the command's own handler takes it) on its
    second call, then goes on; returns what happened at each call."""
    real, calls = getattr(module, name), []

    def hooked(*args, **kwargs):
        calls.append("called")
        if len(calls) == 2:
            os.kill(os.getpid(), signal.SIGTERM)
            calls.append("went on after the signal")
        return real(*args, **kwargs)

    monkeypatch.setattr(module, name, hooked)
    return calls


@pytest.mark.parametrize("where", ["deciding to skip it", "reporting on it"])
def test_a_signal_while_a_complete_record_is_skipped_leaves_it_complete(
        where, hydrogens, tmp_path, run_cli, monkeypatch, no_slurm_array):
    """SIGTERM while the batch skips the second molecule, whose record is complete: the batch
    finishes that row and stops with 143 (the row said 'interrupted', the record 'complete')."""
    from dfmp2.jobs import batch, run as run_job

    out = tmp_path / "out"
    first = run_batch(run_cli, hydrogens[:3], out, "--threads", "1", "--json")
    assert first.code == 0, first.err
    module, name = ((run_job, "shared_previous_run") if where == "deciding to skip it"
                    else (batch, "_energies"))
    calls = _signal_on_second_call(monkeypatch, module, name)
    result = run_batch(run_cli, hydrogens[:3], out, "--threads", "1")
    assert result.code == 143, result.err
    assert result.err.strip().splitlines()[-1] == "Error: terminated by signal SIGTERM"
    rows = json.loads((out / "summary.json").read_text())
    assert [row["status"] for row in rows] == ["complete (skipped)", "complete (skipped)",
                                              "not started"]
    assert rows[1]["e_tot"] == json.loads(first.out)[1]["e_tot"] and rows[1]["error"] == ""
    assert status(read_record(out / "h2_1-sto-3g.h5")) == "complete"
    assert calls == ["called", "called", "went on after the signal"]


def test_a_signal_still_stops_a_batchs_calculation_at_once(hydrogens, tmp_path, run_cli,
                                                           monkeypatch, no_slurm_array):
    """The batch waits for a skip's row, not for a calculation: SIGTERM as the second molecule
    starts computing ends it there, its record interrupted."""
    from dfmp2.jobs import run as run_job

    calls = _signal_on_second_call(monkeypatch, run_job, "calculate")
    out = tmp_path / "out"
    result = run_batch(run_cli, hydrogens[:3], out, "--threads", "1")
    assert result.code == 143, result.err
    assert calls == ["called", "called"], "the signal was held through the calculation"
    rows = json.loads((out / "summary.json").read_text())
    assert [row["status"] for row in rows] == ["complete", "interrupted", "not started"]
    assert status(read_record(out / "h2_1-sto-3g.h5")) == "interrupted"
