"""What happens to records when things go wrong: full disks, two runs on one record, errors
after the SCF, signals, and batch reruns with changed options."""
from __future__ import annotations

import json
import re
import os
import resource
import shutil
import signal
import sys
import subprocess
import time
import weakref
from pathlib import Path

import h5py
import numpy as np
import pytest

from conftest import MOLECULES, WATER_RECORD_ARGS, assert_ends_with, molecule_path, \
    pyscf_df_rhf, pyscf_dfmp2_reference, pyscf_molecule, python_exe, stored_orbitals_e_corr
from dfmp2 import cli
from dfmp2.errors import InputError, Interrupted
from dfmp2.records.checkpoint import RecordSaver
from dfmp2.records.frequencies_section import (DisplacementSection, Point, read_points,
                                               write_points)
from dfmp2.records.job_sections import read_steps
from dfmp2.records.sections import Checkpoint, read_checkpoint
from dfmp2.records.tree import Node, read_record
from dfmp2.system import interrupts

TIMEOUT_SECONDS = 180
POLL_SECONDS = 0.02
# The fitted B of water/cc-pVDZ: 84 auxiliary functions x 5 occupied x 19 virtual, fp64.
WATER_B_BYTES = 84 * 5 * 19 * 8


def dfmp2_command(*args) -> list[str]:
    return [python_exe(), "-m", "dfmp2", *map(str, args)]


def run_with_file_limit(limit: int, *args, cwd: Path, command: str = "run"
                        ) -> subprocess.CompletedProcess:
    """``dfmp2 COMMAND`` where no file may grow beyond ``limit`` bytes (``ulimit -f``): writes
    past it fail with EFBIG, exactly as writes on a full disk fail with ENOSPC."""
    def limit_files() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    return subprocess.run(dfmp2_command(command, *args), capture_output=True, text=True,
                          cwd=cwd, preexec_fn=limit_files, timeout=TIMEOUT_SECONDS, check=False)


def leftovers(folder: Path) -> list[str]:
    """Temporary, lock and scratch files a run left behind."""
    return sorted(p.name for p in folder.iterdir()
                  if p.name.startswith(".") and p.suffix in (".tmp", ".lock", ".bin", ".h5"))


def one_error_line(stderr: str) -> str:
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error:"), stderr
    assert "Traceback" not in stderr
    return lines[0]


# ------------------------------------------------------------------------------- full disk

WATER_OUT_OF_CORE = (molecule_path("water"), "--scf", "conventional", "--memory", "100KB",
                     "--backend", "torch", "-o", "w.h5")


def test_full_disk_at_the_first_record_write(tmp_path):
    result = run_with_file_limit(4000, *WATER_OUT_OF_CORE, cwd=tmp_path)
    assert result.returncode == 1
    assert "cannot write the run record w.h5: File too large" in one_error_line(result.stderr)
    assert not (tmp_path / "w.h5").exists()
    assert leftovers(tmp_path) == []


def test_full_disk_while_writing_the_scratch_file(tmp_path):
    """The free-space check passes (B itself fits), then the file's header tips it over."""
    result = run_with_file_limit(WATER_B_BYTES + 64, *WATER_OUT_OF_CORE, cwd=tmp_path)
    assert result.returncode == 1, result.stderr
    assert "cannot write the scratch file" in one_error_line(result.stderr)
    root = read_record(tmp_path / "w.h5")
    assert root.attrs["status"] == "failed" and "scratch file" in root.attrs["error"]
    assert leftovers(tmp_path) == []


def test_a_rerun_that_cannot_write_its_record_puts_the_complete_one_back(tmp_path):
    """The complete record was moved aside, the rerun could not write a byte, and the error
    line did not say where the result had gone: -o pointed at nothing."""
    first = subprocess.run(dfmp2_command("run", *WATER_OUT_OF_CORE), capture_output=True,
                           text=True, cwd=tmp_path, timeout=TIMEOUT_SECONDS)
    assert first.returncode == 0, first.stderr
    result = run_with_file_limit(4000, *WATER_OUT_OF_CORE, cwd=tmp_path)
    assert result.returncode == 1
    assert "the earlier complete record is back at w.h5" in one_error_line(result.stderr)
    assert read_record(tmp_path / "w.h5").attrs["status"] == "complete"
    assert not list(tmp_path.glob("w.superseded-*")) and leftovers(tmp_path) == []


def test_a_record_with_an_overlong_creation_time_is_still_set_aside(run_cli, tmp_path):
    """The name of the copy was built from the whole 'created' attribute: 300 characters of
    it ended the rerun in OSError: File name too long."""
    args = ("run", molecule_path("water"), "--basis", "sto-3g", "--backend", "torch",
            "--threads", "1", "-o", tmp_path / "r.h5")
    assert run_cli(*args).code == 0
    with h5py.File(tmp_path / "r.h5", "r+") as h5:
        h5.attrs["created"] = "1" * 300
    assert run_cli(*args, "--basis", "6-31g").code == 0
    [kept] = tmp_path.glob("r.superseded-*.h5")
    assert kept.name == "r.superseded-" + "1" * 19 + ".h5"


def test_too_little_room_for_the_scratch_file_is_said_before_writing(tmp_path):
    result = run_with_file_limit(40_000, *WATER_OUT_OF_CORE, cwd=tmp_path)
    assert result.returncode == 1
    assert "not enough disk space" in one_error_line(result.stderr)
    assert read_record(tmp_path / "w.h5").attrs["status"] == "failed"
    assert leftovers(tmp_path) == []


def test_full_disk_at_a_checkpoint_leaves_a_failed_record(tmp_path):
    """The record after the SCF (with the orbitals) no longer fits; a smaller one saying
    'failed' still does."""
    args = (molecule_path("water"), "--scf", "conventional", "--backend", "torch", "-o", "w.h5")
    first = run_with_file_limit(10**7, *args, cwd=tmp_path)
    assert first.returncode == 0, first.stderr
    full_size = (tmp_path / "w.h5").stat().st_size
    (tmp_path / "w.h5").unlink()
    result = run_with_file_limit(full_size - 2000, *args, cwd=tmp_path)
    assert result.returncode == 1
    assert "cannot write the run record" in one_error_line(result.stderr)
    root = read_record(tmp_path / "w.h5")
    assert root.attrs["status"] == "failed" and "File too large" in root.attrs["error"]
    assert leftovers(tmp_path) == []


def test_a_record_too_large_for_any_failed_version_keeps_its_last_save_and_says_so(tmp_path):
    """A frequency record holding finished points, on a disk that then holds not even its
    attributes: it stays as last saved (running, resumable), which the error line now says,
    and the rerun with room finishes it from the saved points."""
    args = (molecule_path("water"), "--basis", "sto-3g", "--backend", "torch", "--threads",
            "1", "-o", "f.h5")
    kept = []
    for kib in (12, 14):
        (tmp_path / "f.h5").unlink(missing_ok=True)
        result = run_with_file_limit(kib * 1024, *args, cwd=tmp_path, command="frequencies")
        assert result.returncode == 1, result.stderr
        line = one_error_line(result.stderr)
        record = tmp_path / "f.h5"
        if record.exists() and read_record(record).attrs["status"] == "running":
            assert "the record keeps its last save, status running" in line
            kept.append(kib)
        else:
            assert "keeps its last save" not in line
    assert kept, "no limit left the record at its last save"
    rerun = subprocess.run(dfmp2_command("frequencies", *args, "--json"), capture_output=True,
                           text=True, cwd=tmp_path, timeout=TIMEOUT_SECONDS)
    assert rerun.returncode == 0, rerun.stderr
    assert read_record(tmp_path / "f.h5").attrs["status"] == "complete"


def test_an_optimised_geometry_file_stands_only_beside_a_complete_record(tmp_path, run_cli):
    """The final write of an optimisation's record fails on a full disk: the geometry file
    written just before it must go too, or a script would take it for a finished result."""
    args = (molecule_path("water"), "--basis", "sto-3g", "--backend", "torch", "--threads",
            "1", "-o", "w.h5")
    full = run_cli("optimize", *args[:-1], tmp_path / "w.h5")
    assert full.code == 0, full.err
    full_size = (tmp_path / "w.h5").stat().st_size
    geometry = (tmp_path / "w.xyz").read_text()
    # A rerun of other inputs on a disk full from its start: the complete record goes back,
    # and the geometry beside it too (it stayed under the set-aside name).
    other = run_with_file_limit(4096, *args, "--convergence", "GAU_TIGHT", cwd=tmp_path,
                                command="optimize")
    assert other.returncode == 1, other.stderr
    assert "the earlier complete record is back at w.h5" in one_error_line(other.stderr)
    assert read_record(tmp_path / "w.h5").attrs["status"] == "complete"
    assert (tmp_path / "w.xyz").read_text() == geometry
    assert sorted(p.name for p in tmp_path.iterdir() if p.suffix == ".xyz") == ["w.xyz"]
    for short_by in (200, 1000):
        for name in ("w.h5", "w.xyz"):
            (tmp_path / name).unlink(missing_ok=True)
        result = run_with_file_limit(full_size - short_by, *args, cwd=tmp_path,
                                     command="optimize")
        assert result.returncode == 1, result.stderr
        assert "cannot write the run record" in one_error_line(result.stderr)
        assert read_record(tmp_path / "w.h5").attrs["status"] != "complete"
        assert not (tmp_path / "w.xyz").exists()
    assert leftovers(tmp_path) == []


def test_a_molden_file_beside_a_complete_record_stays_when_a_rerun_cannot_write(tmp_path,
                                                                                run_cli):
    """frequencies --molden again with another pressure (the complete record's points
    analysed again) on a full disk: the record went back as it was, but its Molden file had
    been replaced and then removed with the failed run's outputs."""
    args = (molecule_path("water"), "--basis", "sto-3g", "--backend", "torch", "--threads",
            "1", "-o", "f.h5", "--molden", "m.molden")
    first = run_cli("frequencies", *args[:-4], "-o", tmp_path / "f.h5", "--molden",
                    tmp_path / "m.molden")
    assert first.code == 0, first.err
    record, molden = (tmp_path / "f.h5").read_bytes(), (tmp_path / "m.molden").read_text()
    rerun = run_with_file_limit(len(molden) + 4096, *args, "--pressure", "200000",
                                cwd=tmp_path, command="frequencies")
    assert rerun.returncode == 1, rerun.stderr
    # (After the warning that water at this geometry is no stationary point.)
    assert "Error: cannot write the run record" in rerun.stderr.strip().splitlines()[-1]
    assert (tmp_path / "f.h5").read_bytes() == record
    assert (tmp_path / "m.molden").read_text() == molden
    assert leftovers(tmp_path) == []


# ------------------------------------------------------------------------- concurrent runs

def _pairs_done(record: Path) -> int:
    try:
        checkpoint = read_record(record).groups.get("checkpoint")
    except InputError:
        return 0
    return 0 if checkpoint is None else len(checkpoint.datasets.get("pairs", []))


def _wait_for_pairs(proc: subprocess.Popen, record: Path, count: int,
                    stop: bool = False) -> None:
    """Until the record holds ``count`` finished pairs; with ``stop`` the run is then frozen
    (SIGSTOP), so that it cannot finish while the test looks at it (SIGCONT resumes it)."""
    deadline = time.monotonic() + TIMEOUT_SECONDS
    while _pairs_done(record) < count and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(POLL_SECONDS)
    if stop:
        proc.send_signal(signal.SIGSTOP)
    assert proc.poll() is None, "the run finished before the test could act on it"


# 55 block pairs of one orbital each, a record save after every one: a run slow enough to
# be caught in the middle of its energy step, with a quick (conventional) SCF.
DIMER = (molecule_path("water_dimer"), "--scf", "conventional", "--backend", "torch",
         "--occ-block", "1", "--json")
DIMER_PAIRS = 10 * 11 // 2


def test_a_second_run_on_a_record_in_use_is_refused(tmp_path, run_cli):
    record = tmp_path / "dimer.h5"
    first = subprocess.Popen(dfmp2_command("run", *DIMER, "-o", record),
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    _wait_for_pairs(first, record, 2, stop=True)
    second = run_cli("run", *DIMER, "-o", record)
    first.send_signal(signal.SIGCONT)
    assert second.code == 2
    line = one_error_line(second.err)
    assert "in use by another dfmp2 run" in line and str(first.pid) in line
    out, err = first.communicate(timeout=TIMEOUT_SECONDS)
    assert first.returncode == 0, err
    assert read_record(record).attrs["status"] == "complete"
    assert json.loads(out)["status"] == "complete"
    assert leftovers(tmp_path) == []


# ------------------------------------------------------------------- signals and scratch

OUT_OF_CORE = ("--memory", "800KB")


# A SIGTERM sent the moment a thread is created, inside Thread.start: PySCF's prefetch of its
# JK-fit tensor file here, then the MP2 stage's read-ahead.
SIGTERM_AS_A_THREAD_STARTS = """
import os, signal, sys, threading
start = threading._start_new_thread
def start_then_stop(function, args, *rest):
    ident = start(function, args, *rest)
    os.kill(os.getpid(), signal.SIGTERM)
    return ident
threading._start_new_thread = start_then_stop
from dfmp2.cli import main
main(sys.argv[1:])
"""


def test_sigterm_as_a_thread_starts_is_one_line(tmp_path):
    """Raised inside Thread.start, the stop broke the threading module's bookkeeping, and the
    new thread printed a KeyError traceback before the error line."""
    proc = subprocess.run([python_exe(), "-c", SIGTERM_AS_A_THREAD_STARTS, "run",
                           molecule_path("water_dimer"), "--scf-engine", "pyscf", "--memory",
                           "2MB", "--backend", "torch", "--threads", "1", "-o",
                           tmp_path / "d.h5"], capture_output=True, text=True, cwd=tmp_path,
                          timeout=TIMEOUT_SECONDS)
    assert proc.returncode == 128 + signal.SIGTERM, proc.stderr
    assert "terminated by signal SIGTERM" in one_error_line(proc.stderr)
    assert read_record(tmp_path / "d.h5").attrs["status"] == "interrupted"


def _stopped_mid_energy(args: tuple, record: Path, pairs: int, folder: Path) -> subprocess.Popen:
    """``dfmp2 run *args`` started in ``folder`` and frozen once ``pairs`` pairs are done."""
    proc = subprocess.Popen(dfmp2_command("run", *args), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, cwd=folder)
    _wait_for_pairs(proc, record, pairs, stop=True)
    return proc


def _ended_by_signal(proc: subprocess.Popen, signum: int) -> str:
    """Send a frozen run ``signum``, thaw it, and return its stderr once it has ended."""
    proc.send_signal(signum)
    proc.send_signal(signal.SIGCONT)
    return proc.communicate(timeout=TIMEOUT_SECONDS)[1]


def test_sigterm_checkpoints_cleans_up_and_resumes(tmp_path, run_cli):
    record = tmp_path / "dimer.h5"
    args = (*DIMER, *OUT_OF_CORE, "-o", record)
    proc = _stopped_mid_energy(args, record, 3, tmp_path)
    assert [p for p in leftovers(tmp_path) if p.endswith(".bin")], "B is not out of core"
    err = _ended_by_signal(proc, signal.SIGTERM)
    assert proc.returncode == 128 + signal.SIGTERM, err
    assert one_error_line(err).startswith(
        "Error: terminated by signal SIGTERM; what was finished is in the record, and "
        "rerunning the same command resumes it (record ")
    killed = read_record(record)
    assert killed.attrs["status"] == "interrupted"
    done = len(killed.groups["checkpoint"].datasets["pairs"])
    assert leftovers(tmp_path) == []

    resumed = run_cli("run", *args)
    assert resumed.code == 0, resumed.err
    root = read_record(record)
    assert root.attrs["status"] == "complete" and root.attrs["resumed"]
    assert len(root.groups["checkpoint"].datasets["pairs"]) == DIMER_PAIRS > done
    # PySCF's DF-MP2 on the orbitals the interrupted run stored and the resumed one reused.
    assert abs(json.loads(resumed.out)["e_corr"]
               - stored_orbitals_e_corr(record, "water_dimer")) <= 1e-10
    assert leftovers(tmp_path) == []


def test_a_crash_prints_where_each_thread_was_and_the_rerun_resumes(tmp_path, run_cli):
    """A crash in a C extension (here a SIGSEGV sent to the run) ended the process with
    nothing on stderr: one CI run died so after its error line, and nothing said where. The
    command enables Python's fault handler, so the stack of every thread is printed; the
    record keeps what was finished, and the rerun takes the dead run's lock and resumes."""
    record = tmp_path / "dimer.h5"
    args = (*DIMER, "-o", record)
    proc = _stopped_mid_energy(args, record, 2, tmp_path)
    err = _ended_by_signal(proc, signal.SIGSEGV)
    assert proc.returncode == -signal.SIGSEGV
    assert "Fatal Python error: Segmentation fault" in err
    assert re.search(r'File ".*dfmp2/.*\.py", line \d+ in \w+', err), err
    resumed = run_cli("run", *args)
    assert resumed.code == 0, resumed.err
    assert read_record(record).attrs["resumed"]
    assert leftovers(tmp_path) == []


def test_a_hangup_stops_the_run_as_sigterm_does_unless_it_was_started_ignoring_it(tmp_path):
    """The terminal or SSH session of a run started in it closes (SIGHUP): the run used to die
    there, leaving a record marked running and its scratch files. It now saves what is
    finished and says so, as on SIGTERM; under nohup (SIGHUP ignored) it runs on."""
    record = tmp_path / "dimer.h5"
    args = (*DIMER, *OUT_OF_CORE, "-o", record)
    proc = _stopped_mid_energy(args, record, 3, tmp_path)
    err = _ended_by_signal(proc, signal.SIGHUP)
    assert proc.returncode == 128 + signal.SIGHUP, err
    assert "terminated by signal SIGHUP" in one_error_line(err)
    assert read_record(record).attrs["status"] == "interrupted"
    assert leftovers(tmp_path) == []

    ignored = tmp_path / "nohup.h5"
    proc = subprocess.Popen(dfmp2_command("run", *DIMER, "-o", ignored), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, cwd=tmp_path,
                            preexec_fn=lambda: signal.signal(signal.SIGHUP, signal.SIG_IGN))
    _wait_for_pairs(proc, ignored, 3, stop=True)
    proc.send_signal(signal.SIGHUP)
    proc.send_signal(signal.SIGCONT)
    out, err = proc.communicate(timeout=TIMEOUT_SECONDS)
    assert proc.returncode == 0, err
    assert json.loads(out)["status"] == "complete"
    assert read_record(ignored).attrs["status"] == "complete"


# Python reports the callback's ignored exception, which is what this test provokes.
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_a_signal_swallowed_where_it_landed_stops_the_run_at_its_next_checkpoint(tmp_path):
    """A SIGTERM that lands in a weakref callback: Python ignores the handler's exception
    there (this let 1 run in 10 of the test above finish with status 0). The request is kept,
    and the next checkpoint raises it, after saving."""
    class Tracked:
        pass

    tracked = Tracked()
    watcher = weakref.ref(tracked, lambda _: cli._raise_interrupted(signal.SIGTERM, None))
    try:
        del tracked  # the callback runs here; its exception is printed and ignored
        assert watcher() is None
        saver = RecordSaver(tmp_path / "run.h5", Node(attrs={"status": "running"}))
        with pytest.raises(Interrupted, match="terminated by signal SIGTERM") as stop:
            saver.save()
        assert stop.value.exit_code == 128 + signal.SIGTERM
        with h5py.File(tmp_path / "run.h5", "r") as h5:
            assert h5.attrs["status"] == "running"
    finally:
        interrupts.clear()
    RecordSaver(tmp_path / "next.h5", Node()).save()


def test_a_signal_inside_a_checkpoint_write_is_raised_once_the_checkpoint_is_whole(tmp_path):
    """A SIGTERM that landed between a checkpoint's pairs and their sums: the stopping run
    saved 12 pairs and 11 sums, and the resume refused the record as altered (CI, in
    test_sigterm_checkpoints_cleans_up_and_resumes). The handler is called where the write
    reads the new pair's sums, as the signal would run it there."""
    class StopOnRead(dict):
        stopped = False

        def __getitem__(self, key):
            if not StopOnRead.stopped:
                StopOnRead.stopped = True
                cli._raise_interrupted(signal.SIGTERM, None)
            return super().__getitem__(key)

    saver = RecordSaver(tmp_path / "run.h5", Node(attrs={"status": "running"}))
    saver.start_pairs(2, {(0, 0, i, 0, 0): (-0.1 * i, 0.01 * i) for i in range(11)})
    saver.checkpoint = Checkpoint(2, StopOnRead(saver.checkpoint.pairs))
    try:
        with pytest.raises(Interrupted, match="terminated by signal SIGTERM"):
            saver.add_pair((0, 0, 11, 0, 0), -1.1, 0.11)
        assert StopOnRead.stopped
        # What the stopping run saves, and its resume reads.
        kept = read_checkpoint(saver.node)
        assert len(kept.pairs) == 12 and kept.pairs[(0, 0, 11, 0, 0)] == (-1.1, 0.11)
    finally:
        interrupts.clear()


def test_every_writer_of_a_record_section_holds_signals_until_it_is_done():
    """The checkpoint's fault above, for every section: a writer of the record in memory
    (first parameter a Node) runs under written_whole, so a stopping run never saves half of
    a section (orbitals without their energies, points without their gradients)."""
    import importlib
    import inspect
    import pkgutil

    import dfmp2.records

    writers = []
    for module_info in pkgutil.iter_modules(dfmp2.records.__path__):
        module = importlib.import_module(f"dfmp2.records.{module_info.name}")
        for name, function in inspect.getmembers(module, inspect.isfunction):
            parameters = list(inspect.signature(function).parameters.values())
            if (function.__module__ == module.__name__ and parameters
                    and parameters[0].annotation == "Node"
                    and name.startswith(("write", "set_", "copy_"))):
                writers.append(function)
    writers.append(dfmp2.records.sections.Section.write)
    assert len(writers) >= 20
    assert [w.__qualname__ for w in writers if w.__code__.co_name != "whole"] == []


def test_a_second_signal_does_not_break_off_the_first_ones_stop():
    """Ctrl-C pressed again, or SIGTERM then SIGINT: the first signal stops the run, the
    second is ignored (it used to land in the saving of the interrupted record, leaving it
    `running` with two contradicting messages, or in torch's exit callbacks)."""
    try:
        with pytest.raises(Interrupted, match="SIGTERM"):
            cli._raise_interrupted(signal.SIGTERM, None)
        assert cli._raise_interrupted(signal.SIGINT, None) is None
        with pytest.raises(Interrupted, match="SIGTERM"):
            interrupts.raise_if_requested()
    finally:
        interrupts.clear()


def test_an_interrupt_python_could_not_raise_is_not_printed(capsys, monkeypatch):
    """The kept request of a signal that landed in a weakref callback prints nothing (the run
    ends with one error line at its next checkpoint; 1 run in 20 of the SIGTERM test above
    printed the ignored exception's traceback); any other such exception is printed."""
    class Tracked:
        pass

    def raising(exc):
        def callback(_):
            raise exc
        return callback

    monkeypatch.setattr(sys, "unraisablehook", cli._quiet_kept_interrupt)
    printed = []
    for exc in (Interrupted("terminated by signal SIGTERM", 143), ValueError("a real bug")):
        tracked = Tracked()
        watcher = weakref.ref(tracked, raising(exc))
        del tracked
        assert watcher() is None
        printed.append(capsys.readouterr().err)
    assert printed[0] == "" and "a real bug" in printed[1]


@pytest.fixture(scope="module")
def killed_dimer(tmp_path_factory) -> Path:
    """The folder of a run killed (SIGKILL) three pairs into its energy, B out of core: the
    record, its lock and the finished scratch file, made once; tests resume copies of it."""
    folder = tmp_path_factory.mktemp("killed")
    record = folder / "dimer.h5"
    proc = subprocess.Popen(dfmp2_command("run", *DIMER, *OUT_OF_CORE, "-o", record),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            cwd=folder)
    _wait_for_pairs(proc, record, 3)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    return folder


def _copy_of(folder: Path, into: Path) -> Path:
    for path in folder.iterdir():
        shutil.copy2(path, into / path.name)
    return into / "dimer.h5"


def test_sigkill_mid_energy_leaves_what_the_resume_reuses_to_the_exact_energy(
        tmp_path, killed_dimer, run_cli, caplog):
    record = _copy_of(killed_dimer, tmp_path)
    left = leftovers(tmp_path)
    assert any(p.endswith(".bin") for p in left) and ".dimer.h5.lock" in left
    killed = read_record(record)
    assert killed.attrs["status"] == "running" and "mo_coeff" in killed.groups["scf"].datasets
    done = len(killed.groups["checkpoint"].datasets["pairs"])
    assert 3 <= done < DIMER_PAIRS

    resumed = run_cli("run", *DIMER, *OUT_OF_CORE, "-o", record, "-v")
    assert resumed.code == 0, resumed.err
    assert "reusing the fitted B" in caplog.text
    with h5py.File(record, "r") as h5:
        assert h5.attrs["status"] == "complete" and h5.attrs["resumed"]
        assert h5["timings"].attrs["integrals"] == 0.0
        assert len(h5["checkpoint/pairs"]) == DIMER_PAIRS
    # PySCF's DF-MP2 on the orbitals the killed run stored and the resumed one reused.
    assert abs(json.loads(resumed.out)["e_corr"]
               - stored_orbitals_e_corr(record, "water_dimer")) <= 1e-10
    assert leftovers(tmp_path) == []
    # The reused B's kernel calls (the killed run's, kept in its file) are in the ledger, as
    # a fresh run's are: the resumed record named none of the calls that built its B.
    fresh = tmp_path / "fresh"
    fresh.mkdir()
    assert run_cli("run", *DIMER, *OUT_OF_CORE, "-o", fresh / "dimer.h5").code == 0
    ledgers = [read_record(path).groups["backend"].attrs for path in (record, fresh / "dimer.h5")]
    for kernel in ("transform_gemm", "trsm"):
        calls = [ledger[f"calls.{kernel}.torch-cpu"] for ledger in ledgers]
        assert calls[0] == calls[1] > 0


def test_a_damaged_scratch_file_is_rebuilt(tmp_path, killed_dimer, run_cli, caplog):
    record = _copy_of(killed_dimer, tmp_path)
    scratch = next(p for p in tmp_path.iterdir() if p.suffix == ".bin")
    with open(scratch, "r+b") as handle:
        handle.truncate(scratch.stat().st_size // 2)
    resumed = run_cli("run", *DIMER, *OUT_OF_CORE, "-o", record, "-v")
    assert resumed.code == 0, resumed.err
    assert "it will be rebuilt" in caplog.text
    with h5py.File(record, "r") as h5:
        assert h5["timings"].attrs["integrals"] > 0.0
    assert leftovers(tmp_path) == []


def test_a_resume_that_keeps_b_in_memory_removes_the_killed_runs_scratch_file(
        tmp_path, killed_dimer, run_cli):
    """The killed run kept B in a file; resumed with room for B in memory, the run has no use
    for it, and the file (of the size of B) used to stay on disk after it completed."""
    record = _copy_of(killed_dimer, tmp_path)
    resumed = run_cli("run", *DIMER, "-o", record)
    assert resumed.code == 0, resumed.err
    with h5py.File(record, "r") as h5:
        assert h5.attrs["status"] == "complete" and h5.attrs["resumed"]
        assert not h5["plan"].attrs["out_of_core"]
    assert leftovers(tmp_path) == []


def test_records_of_one_name_in_two_folders_keep_their_own_files_in_a_shared_scratch(
        tmp_path, run_cli, caplog):
    """a/dimer.h5 killed with B in the shared --scratch folder, then b/dimer.h5 run to the
    end there: b's run took a's B as its own (same name) and removed it when it completed,
    so a's resume had to build B again."""
    shared, first, second = (tmp_path / name for name in ("scratch", "a", "b"))
    for folder in (shared, first, second):
        folder.mkdir()
    args = (*DIMER, *OUT_OF_CORE, "--scratch", shared)
    proc = subprocess.Popen(dfmp2_command("run", *args, "-o", first / "dimer.h5"),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    _wait_for_pairs(proc, first / "dimer.h5", 2)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    kept = leftovers(shared)
    assert [name for name in kept if name.endswith(".b0.bin")], "B is not in the scratch folder"

    other = run_cli("run", *args, "-o", second / "dimer.h5")
    assert other.code == 0, other.err
    assert leftovers(shared) == kept, "the other record's run touched the killed run's files"
    resumed = run_cli("run", *args, "-o", first / "dimer.h5", "-v")
    assert resumed.code == 0, resumed.err
    assert "reusing the fitted B" in caplog.text
    assert leftovers(shared) == []


def test_a_resume_in_another_scratch_folder_removes_the_killed_runs_files(tmp_path, run_cli):
    """A run killed with B in --scratch s1 and resumed with --scratch s2 (a cluster's
    per-job scratch folder) rebuilt B in s2 and left the killed run's B, the run's largest
    file, in s1 for good. The record names s1; the completed run removes its files there."""
    first, second = tmp_path / "s1", tmp_path / "s2"
    first.mkdir()
    second.mkdir()
    record = tmp_path / "dimer.h5"
    proc = subprocess.Popen(dfmp2_command("run", *DIMER, *OUT_OF_CORE, "--scratch", first,
                                          "-o", record),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    _wait_for_pairs(proc, record, 2)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert [name for name in leftovers(first) if name.endswith(".b0.bin")]
    unrelated = first / ".dimer.h5.notes.bin"
    unrelated.write_text("not a stage of this record's runs")
    resumed = run_cli("run", *DIMER, *OUT_OF_CORE, "--scratch", second, "-o", record)
    assert resumed.code == 0, resumed.err
    with h5py.File(record, "r") as h5:
        assert h5.attrs["status"] == "complete" and h5.attrs["resumed"]
    assert leftovers(first) == [unrelated.name]
    assert leftovers(second) == []


# --------------------------------------------------------------- failures after the SCF

def test_a_signal_that_code_caught_and_turned_into_another_error_stops_the_run(
        tmp_path, run_cli, monkeypatch):
    """A SIGTERM landing in PySCF's basis loader, which catches the handler's exception and
    tries other basis names, ended in BasisNotFoundError: a traceback, status 1 and a record
    marked failed. The kept request decides: the run was stopped."""
    import dfmp2.mp2.kernel

    def signal_then_other_error(*args):
        interrupts.request(Interrupted("terminated by signal SIGTERM; what was finished is "
                                       "in the record", 128 + signal.SIGTERM))
        raise KeyError("ano")

    monkeypatch.setattr(dfmp2.mp2.kernel, "fit_basis", signal_then_other_error)
    record = tmp_path / "w.h5"
    result = run_cli("run", molecule_path("water"), "--basis", "sto-3g", "--backend", "torch",
                     "-o", record)
    assert result.code == 128 + signal.SIGTERM
    assert "terminated by signal SIGTERM" in one_error_line(result.err)
    root = read_record(record)
    assert root.attrs["status"] == "interrupted" and "SIGTERM" in root.attrs["error"]
    assert "mo_coeff" in root.groups["scf"].datasets, "the finished SCF is kept for resuming"


def test_an_error_after_the_scf_marks_the_record_failed(tmp_path, run_cli, monkeypatch):
    import dfmp2.mp2.kernel
    record = tmp_path / "w.h5"
    real = dfmp2.mp2.kernel.fit_basis
    monkeypatch.setattr(dfmp2.mp2.kernel, "fit_basis",
                        lambda *a: (_ for _ in ()).throw(InputError("injected after the SCF")))
    failed = run_cli("run", molecule_path("water"), "--backend", "torch", "-o", record)
    assert failed.code == 2 and "injected after the SCF" in one_error_line(failed.err)
    root = read_record(record)
    assert root.attrs["status"] == "failed" and "injected" in root.attrs["error"]
    monkeypatch.setattr(dfmp2.mp2.kernel, "fit_basis", real)

    other = run_cli("run", molecule_path("water"), "--backend", "torch", "--frozen", "1",
                    "--json", "-o", record)
    assert other.code == 0, other.err
    replaced = read_record(record)
    assert replaced.attrs["status"] == "complete" and not replaced.attrs["resumed"]
    assert replaced.groups["input"].attrs["frozen"] == 1


def test_a_signal_during_the_final_write_keeps_the_finished_work(tmp_path, run_cli,
                                                                  monkeypatch):
    """torchrun sends SIGTERM to the surviving ranks while rank 0 is ending its record after
    a dead rank: the interrupted write is done again with the SCF orbitals, not replaced by a
    record without datasets (seen once under torchrun: a record with no pairs left)."""
    import dfmp2.mp2.kernel
    from dfmp2.jobs import session
    from dfmp2.errors import Interrupted
    record = tmp_path / "w.h5"
    monkeypatch.setattr(dfmp2.mp2.kernel, "fit_basis",
                        lambda *a: (_ for _ in ()).throw(InputError("injected after the SCF")))
    real_write = session.write_record
    status_writes = []

    def write_interrupted_once(path, root):
        if root.attrs.get("status") == "failed" and not status_writes:
            status_writes.append(path)
            raise Interrupted("terminated by signal SIGTERM", 143)
        return real_write(path, root)

    monkeypatch.setattr(session, "write_record", write_interrupted_once)
    failed = run_cli("run", molecule_path("water"), "--backend", "torch", "-o", record)
    assert failed.code == 2 and status_writes
    root = read_record(record)
    assert root.attrs["status"] == "failed" and "injected" in root.attrs["error"]
    assert "mo_coeff" in root.groups["scf"].datasets


def test_a_failed_record_with_the_same_options_resumes_its_scf(tmp_path, run_cli, monkeypatch):
    import dfmp2.mp2.kernel
    record = tmp_path / "w.h5"
    real = dfmp2.mp2.kernel.fit_basis
    monkeypatch.setattr(dfmp2.mp2.kernel, "fit_basis",
                        lambda *a: (_ for _ in ()).throw(InputError("injected")))
    assert run_cli("run", molecule_path("water"), "--backend", "torch", "-o", record).code == 2
    monkeypatch.setattr(dfmp2.mp2.kernel, "fit_basis", real)
    again = run_cli("run", molecule_path("water"), "--backend", "torch", "-o", record)
    assert again.code == 0, again.err
    assert read_record(record).attrs["resumed"]


# ----------------------------------------------------------------------- batch reruns

def test_batch_rerun_with_changed_options_recomputes_and_keeps_the_old_record(tmp_path,
                                                                             run_cli, caplog):
    manifest = tmp_path / "jobs.txt"
    out = tmp_path / "out"
    manifest.write_text(f"{MOLECULES / 'water.xyz'} --frozen-core\n")
    first = run_cli("batch", manifest, "--backend", "torch", "--out", out, "--json")
    assert first.code == 0, first.err
    frozen = json.loads(first.out)[0]

    manifest.write_text(f"{MOLECULES / 'water.xyz'}\n")
    second = run_cli("batch", manifest, "--backend", "torch", "--out", out, "--json")
    assert second.code == 0, second.err
    row = json.loads(second.out)[0]
    assert row["status"] == "complete"
    reference = pyscf_dfmp2_reference(pyscf_df_rhf(pyscf_molecule("water", "cc-pvdz")), 0)
    assert abs(row["e_corr"] - reference.e_corr) <= 1e-8
    assert abs(row["e_corr"] - frozen["e_corr"]) > 1e-4
    kept = sorted(out.glob("water-cc-pvdz.superseded-*.h5"))
    assert len(kept) == 1
    assert f"of other inputs, is kept as {kept[0]}" in caplog.text
    old = read_record(kept[0])
    assert old.groups["input"].attrs["frozen"] == 1
    assert old.groups["mp2"].attrs["e_corr"] == pytest.approx(frozen["e_corr"], abs=1e-12)

    third = run_cli("batch", manifest, "--backend", "torch", "--out", out, "--json")
    assert json.loads(third.out)[0]["status"] == "complete (skipped)"
    assert json.loads(third.out)[0]["e_corr"] == pytest.approx(row["e_corr"], abs=1e-12)


def test_batch_runs_the_good_lines_of_a_manifest_with_bad_ones(tmp_path, run_cli):
    manifest = tmp_path / "jobs.txt"
    manifest.write_text(f"{MOLECULES / 'water.xyz'} --basis sto-3g\n"
                        f"missing.xyz\n"
                        f"{MOLECULES / 'ammonia.xyz'} --basis sto-3g --fast\n"
                        f"{MOLECULES / 'methane.xyz'} --basis sto-3g\n")
    out = tmp_path / "out"
    result = run_cli("batch", manifest, "--backend", "torch", "--out", out, "--json")
    assert result.code == 1
    assert "2 of 4 molecules failed" in one_error_line(result.err)
    rows = {Path(r["molecule"]).name: r for r in json.loads(result.out)}
    assert rows["water.xyz"]["status"] == rows["methane.xyz"]["status"] == "complete"
    assert "does not exist" in rows["missing.xyz"]["error"]
    assert "line 3" in rows["ammonia.xyz"]["error"] and "--fast" in rows["ammonia.xyz"]["error"]
    # A line that cannot run is named by its line number, apart from the good lines' records.
    assert read_record(out / "missing-cc-pvdz-line2.h5").attrs["status"] == "failed"
    assert read_record(out / "ammonia-cc-pvdz-line3.h5").attrs["status"] == "failed"


@pytest.mark.parametrize("command", ["show", "show --all", "compare", "run"])
@pytest.mark.parametrize("group, name, value", [
    ("sizes", "nocc", np.array([5, 4])),
    ("scf", "cycles", float("nan")),
    ("checkpoint", "occ_block", "junk"),
    ("", "status", np.arange(3)),
    # A count that is no integer, or too large for one, reached int() or the record's write.
    ("backend", "calls.mp2_energy.torch-cpu", ""),
    ("scf", "cycles", 1e308),
])
def test_a_record_with_values_of_another_kind_is_one_error_line(command, group, name, value,
                                                                  run_cli, tmp_path,
                                                                  water_record):
    """Attributes of another type or shape than dfmp2 writes (a record written by something
    else, or altered): show, compare and a run resuming it end with one error line, exit 2,
    where they ended in tracebacks (TypeError, ValueError), or go on where they do not read
    the attribute (`show --all` prints it as it is)."""
    record = tmp_path / "w.h5"
    args = [*WATER_RECORD_ARGS, "-o", record]
    shutil.copy(water_record, record)
    with h5py.File(record, "r+") as h5:
        h5.attrs["status"] = "interrupted"
        (h5[group] if group else h5).attrs[name] = value
    words = command.split()
    result = run_cli(*(args if words == ["run"] else [*words, record]))
    assert "Traceback" not in result.err
    if result.code != 0:
        assert result.code == 2, result.err
        lines = result.err.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("Error:"), result.err


def _link_to_itself(h5: h5py.File) -> None:
    h5["loop"] = h5py.SoftLink("/loop")


def _link_elsewhere(h5: h5py.File) -> None:
    h5["elsewhere"] = h5py.ExternalLink("/nonexistent.h5", "/")


def _narrow_pairs(h5: h5py.File) -> None:
    del h5["checkpoint/pairs"]
    h5["checkpoint"].create_dataset("pairs", data=np.zeros((3, 3), dtype=int))


def _text_energies(h5: h5py.File) -> None:
    count = len(h5["scf/mo_energy"])
    del h5["scf/mo_energy"]
    h5["scf"].create_dataset("mo_energy", data=np.array([b"x"] * count))


@pytest.mark.parametrize("command", ["show", "show --all", "compare", "run"])
@pytest.mark.parametrize("alter", [_link_to_itself, _link_elsewhere, _narrow_pairs,
                                   _text_energies])
def test_a_record_with_links_or_datasets_of_another_kind_is_one_error_line(
        command, alter, run_cli, tmp_path, water_record):
    """Links (one to itself looped, one to a missing file was a TypeError), checkpoint pairs
    of another width and orbital energies that are not numbers ended in tracebacks."""
    record = tmp_path / "w.h5"
    shutil.copy(water_record, record)
    with h5py.File(record, "r+") as h5:
        h5.attrs["status"] = "interrupted"
        if "checkpoint" not in h5:
            h5.create_group("checkpoint")
            h5["checkpoint"].create_dataset("pairs", data=np.zeros((0, 5), dtype=int))
        alter(h5)
    words = command.split()
    result = run_cli(*([*WATER_RECORD_ARGS, "-o", record] if words == ["run"]
                       else [*words, record]))
    assert "Traceback" not in result.err
    if result.code != 0:
        assert result.code == 2 and one_error_line(result.err)


def test_a_record_another_program_holds_open_is_said_to_be(run_cli, tmp_path, water_record):
    record = tmp_path / "w.h5"
    shutil.copy(water_record, record)
    holder = subprocess.Popen([sys.executable, "-c", "import h5py, sys, time; "
                               "f = h5py.File(sys.argv[1], 'r+'); print('open', flush=True); "
                               "time.sleep(60)", str(record)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "open"
        result = run_cli("show", record)
        assert result.code == 2 and "is open in another program" in one_error_line(result.err)
    finally:
        holder.kill()
        holder.wait()


def test_compare_names_a_record_without_energies_for_what_it_is(run_cli, tmp_path,
                                                               water_record):
    """A complete record without SCF and MP2 energies (an optimisation's, say): compare says
    so, where it said 'not a complete run record (status 'complete')'."""
    record = tmp_path / "w.h5"
    shutil.copy(water_record, record)
    with h5py.File(record, "r+") as h5:
        del h5["mp2"]
    result = run_cli("compare", record)
    assert result.code == 2
    assert "record without an SCF and MP2 energy to compare" in result.err


def test_a_refused_rerun_names_the_complete_records_set_aside(run_cli, tmp_path):
    """A rerun with other options was killed: its running record is refused to the original
    command, which was told of 'an interrupted run' and not of the complete copy beside it."""
    record = tmp_path / "w.h5"
    args = ("run", molecule_path("water"), "--basis", "sto-3g", "--backend", "torch",
            "-o", record)
    assert run_cli(*args).code == 0
    shutil.copy(record, tmp_path / "w.superseded-20260101T000000.h5")
    with h5py.File(record, "r+") as h5:
        h5.attrs["status"] = "running"
        h5["input"].attrs["frozen"] = 1
    result = run_cli(*args)
    assert result.code == 2
    assert ("holds an unfinished run with different frozen" in one_error_line(result.err)
            and "complete earlier records beside it: w.superseded-20260101T000000.h5"
            in result.err)


@pytest.mark.parametrize("dataset, value", [
    ("energies", np.array([b"x"])),
    ("coords", np.full((1, 3, 3), np.nan)),
    ("gradients", np.zeros((1, 2, 3))),
])
def test_stored_steps_and_points_of_another_kind_are_input_errors(dataset, value):
    """An optimisation's steps or a frequency job's points altered (text, NaN, another shape)
    reached numpy's comparisons or geomeTRIC ('Gradient contains nan') as tracebacks."""
    steps = Node(groups={"optimize": Node(datasets={
        "coords": np.zeros((1, 3, 3)), "energies": np.zeros(1),
        "gradients": np.zeros((1, 3, 3))})})
    assert read_steps(steps).energies.shape == (1,)
    steps.groups["optimize"].datasets[dataset] = value
    with pytest.raises(InputError, match=f"/optimize {dataset}"):
        read_steps(steps)
    section = DisplacementSection(method="mp2", os_scale=1.0, ss_scale=1.0, step=0.005,
                                  points=19)
    points = Node()
    write_points(points, section, [Point(3, np.zeros((3, 3)), -1.0, np.zeros((3, 3)),
                                         np.zeros(3))])
    assert read_points(points)[1][0].index == 3
    points.groups["displacements"].datasets[dataset] = value
    with pytest.raises(InputError, match=f"/displacements {dataset}"):
        read_points(points)


def test_a_resumed_run_drops_the_complete_copy_its_killed_rerun_set_aside(run_cli, tmp_path,
                                                                          water_record):
    """A rerun over a complete record sets it aside, then is killed; the run that resumes it
    completes the same calculation, and the copy stayed beside it without a word."""
    record = tmp_path / "w.h5"
    copy = tmp_path / "w.superseded-20261128T1200000000.h5"
    other = tmp_path / "w.superseded-20261127T1200000000.h5"
    shutil.copy(water_record, copy)
    shutil.copy(water_record, other)
    with h5py.File(other, "r+") as h5:
        h5["input"].attrs["basis"] = "6-31g"
    shutil.copy(water_record, record)
    with h5py.File(record, "r+") as h5:
        h5.attrs["status"] = "interrupted"
        del h5["mp2"]
    result = run_cli(*WATER_RECORD_ARGS, "-o", record)
    assert result.code == 0, result.err
    assert read_record(record).attrs["status"] == "complete"
    assert not copy.exists() and other.exists()
    # Killed before it wrote its own record: only the copy stood at the name, and stayed.
    record.unlink()
    shutil.copy(water_record, copy)
    assert run_cli(*WATER_RECORD_ARGS, "-o", record).code == 0
    assert read_record(record).attrs["status"] == "complete" and not copy.exists()
    # Killed after it wrote its record, before its SCF was saved: that run starts again, and
    # the copy stayed too.
    shutil.copy(water_record, copy)
    with h5py.File(record, "r+") as h5:
        h5.attrs["status"] = "running"
        for group in ("scf", "mp2", "checkpoint"):
            del h5[group]
    assert run_cli(*WATER_RECORD_ARGS, "-o", record).code == 0
    assert read_record(record).attrs["status"] == "complete" and not copy.exists()
    assert other.exists()


def test_a_resume_over_a_complete_record_killed_as_it_starts_leaves_the_result(run_cli, tmp_path,
                                                                              water_record):
    """--resume over a complete record of the same inputs (a requeued job that always passes
    it) rewrote the record in place: killed (SIGKILL) after its first save, it left a running
    record holding nothing of the result, and the rerun computed it all again."""
    record = tmp_path / "w.h5"
    shutil.copy(water_record, record)
    killed_after_the_first_save = (
        "import os, signal, sys\n"
        "from dfmp2.records import checkpoint\n"
        "write = checkpoint.write_record\n"
        "def write_then_die(path, root):\n"
        "    write(path, root)\n"
        "    os.kill(os.getpid(), signal.SIGKILL)\n"
        "checkpoint.write_record = write_then_die\n"
        "from dfmp2.cli import main\n"
        "main(sys.argv[1:])\n")
    killed = subprocess.run([python_exe(), "-c", killed_after_the_first_save,
                             *WATER_RECORD_ARGS, "--threads", "1", "--resume", "-o", record],
                            capture_output=True, text=True, timeout=TIMEOUT_SECONDS)
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    reference = pyscf_dfmp2_reference(pyscf_df_rhf(pyscf_molecule("water", "sto-3g")), 0)
    kept = [path for path in tmp_path.glob("w*.h5")
            if read_record(path).attrs["status"] == "complete"]
    assert len(kept) == 1
    with h5py.File(kept[0], "r") as h5:
        assert abs(h5["mp2"].attrs["e_tot"] - reference.e_tot) <= 1e-8
    resumed = run_cli(*WATER_RECORD_ARGS, "--threads", "1", "--resume", "-o", record, "--json")
    assert resumed.code == 0, resumed.err
    assert abs(json.loads(resumed.out)["e_tot"] - reference.e_tot) <= 1e-8
    assert [path.name for path in tmp_path.glob("w*.h5")] == ["w.h5"]


def test_a_signal_while_the_complete_copy_is_dropped_does_not_keep_it(run_cli, tmp_path,
                                                                        water_record, caplog,
                                                                        monkeypatch):
    """A rerun completed; a SIGTERM while it checked the complete record it had set aside was
    swallowed there: the copy of the same calculation stayed, with a warning that it was 'of
    other inputs', and the run ended with status 0."""
    from dfmp2.jobs import session

    record = tmp_path / "w.h5"
    shutil.copy(water_record, record)
    read = session.read_record

    def signalled_while_reading(path):
        os.kill(os.getpid(), signal.SIGTERM)
        return read(path)

    monkeypatch.setattr(session, "read_record", signalled_while_reading)
    result = run_cli(*WATER_RECORD_ARGS, "--threads", "1", "-o", record)
    assert result.code == 128 + signal.SIGTERM, result.err
    assert "of other inputs" not in caplog.text
    assert [path.name for path in tmp_path.glob("w*.h5")] == ["w.h5"]
    reference = pyscf_dfmp2_reference(pyscf_df_rhf(pyscf_molecule("water", "sto-3g")), 0)
    with h5py.File(record, "r") as h5:
        assert h5.attrs["status"] == "complete"
        assert abs(h5["mp2"].attrs["e_tot"] - reference.e_tot) <= 1e-8


def test_a_signal_while_a_completed_run_removes_leftovers_stops_it(run_cli, tmp_path,
                                                                   monkeypatch):
    """A SIGTERM while a completed run removed an earlier run's scratch files was swallowed
    as a file that could not go ('... is left: terminated by signal'), and the run ended with
    status 0; had it gone on, the record's lock would not have been released."""
    from dfmp2.jobs import session

    record = tmp_path / "w.h5"
    leftover = tmp_path / ".w.h5.run.b0.bin"
    leftover.write_bytes(b"a killed run's B")
    check = session.refuse_unless_regular

    def signalled_while_checking(path, remedy):
        os.kill(os.getpid(), signal.SIGTERM)
        return check(path, remedy)

    monkeypatch.setattr(session, "refuse_unless_regular", signalled_while_checking)
    result = run_cli(*WATER_RECORD_ARGS, "--threads", "1", "-o", record)
    assert result.code == 128 + signal.SIGTERM, result.err
    monkeypatch.setattr(session, "refuse_unless_regular", check)
    reference = pyscf_dfmp2_reference(pyscf_df_rhf(pyscf_molecule("water", "sto-3g")), 0)
    with h5py.File(record, "r") as h5:
        assert h5.attrs["status"] == "complete"
        assert abs(h5["mp2"].attrs["e_tot"] - reference.e_tot) <= 1e-8
    again = run_cli(*WATER_RECORD_ARGS, "--threads", "1", "-o", record)
    assert again.code == 0, again.err
    assert not leftover.exists()


def test_show_of_an_older_unconverged_record_names_no_missing_gradient(run_cli, tmp_path,
                                                                       water_record):
    """A record written before /scf held the orbital gradient showed 'orbital gradient nan'."""
    record = tmp_path / "w.h5"
    shutil.copy(water_record, record)
    with h5py.File(record, "r+") as h5:
        h5["scf"].attrs["converged"] = False
        del h5["scf"].attrs["orbital_gradient"]
    shown = run_cli("show", record)
    assert shown.code == 0, shown.err
    assert "Warning: the SCF did not converge (after" in shown.out and "nan" not in shown.out


# The byte that starts the datatype of the root's "schema" attribute (an HDF5 version-1
# attribute message: the name, padded to 8 bytes, then the datatype): 0x19 is a
# variable-length string. Other classes there make HDF5 fail to decode it, in other ways.
SCHEMA_DATATYPE_AFTER = b"schema\x00\x00"
VARIABLE_LENGTH_STRING = 0x19


@pytest.mark.parametrize("datatype_byte, h5py_error", [(0x1F, "RuntimeError"),
                                                        (0x12, "TypeError")])
def test_a_record_damaged_inside_is_one_line_for_every_command(
        datatype_byte, h5py_error, water_record, tmp_path, run_cli):
    """A record whose HDF5 structure is damaged (flipped bits, not a truncation) opens, and
    h5py then fails on the broken part with a KeyError, RuntimeError or TypeError: show,
    compare, run -o and a batch over it ended in a traceback. Each is now one line."""
    data = bytearray(water_record.read_bytes())
    at = data.index(SCHEMA_DATATYPE_AFTER) + len(SCHEMA_DATATYPE_AFTER)
    assert data[at] == VARIABLE_LENGTH_STRING
    data[at] = datatype_byte
    damaged = tmp_path / "damaged.h5"
    damaged.write_bytes(bytes(data))

    line = one_error_line(run_cli("show", damaged).err)
    assert f"is a damaged HDF5 file: reading it failed ({h5py_error}" in line
    compared = run_cli("compare", water_record, damaged)
    assert compared.code == 2 and "is a damaged HDF5 file" in one_error_line(compared.err)
    rerun = run_cli(*WATER_RECORD_ARGS, "-o", damaged)
    assert rerun.code == 2 and "is not a dfmp2 run record" in one_error_line(rerun.err)
    assert damaged.read_bytes() == bytes(data)


@pytest.mark.parametrize("command, module, function, memory", [
    ("run", "dfmp2.scf.reference", "stability_of", "1.2MB"),
    ("gradient", "dfmp2.jobs.stages", "write_scf", "2.5MB")])
def test_a_signal_between_the_scf_and_its_release_leaves_no_jk_file(
        command, module, function, memory, run_cli, tmp_path, monkeypatch):
    """SIGTERM right after the SCF converged (during its stability check) or, for a gradient
    that keeps the SCF's tensor, while the SCF is saved: the JK-fit tensor's scratch file
    stayed behind the interrupted record. The signal is sent from inside at that point."""
    import importlib
    target = importlib.import_module(module)
    original = getattr(target, function)

    def signalled(*args, **kwargs):
        os.kill(os.getpid(), signal.SIGTERM)
        return original(*args, **kwargs)

    monkeypatch.setattr(target, function, signalled)
    record = tmp_path / "m.h5"
    result = run_cli(command, molecule_path("methane"), "--basis", "cc-pvtz", "--memory",
                     memory, "-o", record)
    assert result.code == 128 + signal.SIGTERM, result.err
    assert read_record(record).attrs["status"] == "interrupted"
    assert leftovers(tmp_path) == []


def test_a_signal_to_a_command_without_a_record_says_no_record_holds_its_work(
        water_record, run_cli, monkeypatch):
    """Ctrl-C or SIGTERM during compare --reference pyscf (which writes no record) said what
    was finished was in the record and a rerun would resume it."""
    from dfmp2.jobs import compare
    original = compare.pyscf_recipe

    def signalled(*args, **kwargs):
        os.kill(os.getpid(), signal.SIGTERM)
        return original(*args, **kwargs)

    monkeypatch.setattr(compare, "pyscf_recipe", signalled)
    result = run_cli("compare", water_record, "--reference", "pyscf")
    assert result.code == 128 + signal.SIGTERM
    assert one_error_line(result.err) == "Error: terminated by signal SIGTERM"


@pytest.mark.parametrize("name, failure", [
    ("damaged_loops_hdf5.h5", "could not be read: reading it did not finish within 2 s"),
    ("damaged_crashes_hdf5.h5", "it crashed (SIGSEGV)")])
def test_a_record_that_hangs_or_crashes_the_hdf5_library_is_one_line(name, failure, run_cli,
                                                                     tmp_path, monkeypatch):
    """One changed byte made libhdf5 loop forever (show, compare and run -o hung, and no
    signal but SIGKILL stopped them) or crash (exit 139 with the fault handler's dump). A
    record is read in a forked child with a deadline: each is one line, and the file is left
    as it was."""
    from dfmp2.records import isolated

    monkeypatch.setattr(isolated, "DEADLINE_SECONDS", 2.0)
    record = tmp_path / name
    shutil.copy(Path(__file__).parent / "damaged" / name, record)
    before = record.read_bytes()
    damaged = (f"{record} {failure}" if "could not" in failure else
               f"{record} is a damaged HDF5 file: reading it failed ({failure})")
    for args, said in ((("show", record), damaged), (("compare", record, record), damaged),
                       (("run", MOLECULES / "water.xyz", "--basis", "sto-3g", "-o", record),
                        f"output {record} exists and is not a dfmp2 run record")):
        result = run_cli(*args)
        assert result.code == 2, (args, result.err)
        assert result.err.count("\n") == 1 and said in result.err, (args, result.err)
    assert record.read_bytes() == before


def test_a_record_read_in_a_child_gives_back_its_exceptions_and_crashes(tmp_path):
    """The child hands back what the reading function returns or raises; a crash or a
    missed deadline is ChildFailed, and nothing of the child outlives the call."""
    from dfmp2.records.isolated import ChildFailed, in_child

    assert in_child(sorted, [3, 1, 2]) == [1, 2, 3]
    with pytest.raises(InputError, match="refused in the child"):
        in_child(_raise_input_error)
    with pytest.raises(ChildFailed, match="SIGABRT"):
        in_child(os.abort)
    with pytest.raises(ChildFailed, match="did not finish within 0 s"):
        in_child(time.sleep, 30, deadline=0.4)


def test_a_record_is_read_when_sigchld_is_ignored(water_record):
    """A dfmp2 started with SIGCHLD ignored (inherited from a daemon or job runner) has its
    children reaped by the system: waiting for the reader failed with ECHILD, and every
    record read as 'not a readable HDF5 run record'."""
    previous = signal.signal(signal.SIGCHLD, signal.SIG_IGN)
    try:
        assert read_record(water_record).attrs["status"] == "complete"
    finally:
        signal.signal(signal.SIGCHLD, previous)


def test_the_reading_child_ends_when_dfmp2_is_killed(tmp_path):
    """A dfmp2 killed by SIGKILL (the OOM killer, a harness's timeout) while reading a
    looping record left its child spinning at full CPU for good, holding its output pipes."""
    pid_file = tmp_path / "child.pid"
    script = (
        "import os, time\n"
        "from pathlib import Path\n"
        "from dfmp2.records.isolated import in_child\n"
        "def stuck(path):\n"
        "    Path(path).write_text(str(os.getpid()))\n"
        "    while True:\n"
        "        pass\n"
        f"in_child(stuck, {str(pid_file)!r}, deadline=300)\n")
    parent = subprocess.Popen([sys.executable, "-c", script])
    for _ in range(600):
        if pid_file.exists() and pid_file.read_text():
            break
        time.sleep(0.05)
    assert_ends_with(parent, int(pid_file.read_text()), "the reader")


def test_a_healthy_hdf5_file_of_another_program_is_not_called_damaged(tmp_path):
    """A file holding object references (a MATLAB v7.3 .mat file has them), which the reader
    cannot hand back, was called damaged; any foreign file is now read no further than its
    schema."""
    path = tmp_path / "matlab.h5"
    with h5py.File(path, "w") as h5:
        data = h5.create_dataset("x", data=np.arange(3))
        h5.attrs["ref"] = data.ref
        h5["y"] = np.zeros(10)
    with pytest.raises(InputError, match="is an HDF5 file but not a dfmp2 record"):
        read_record(path)


def _raise_input_error() -> None:
    raise InputError("refused in the child")


def test_a_record_of_an_older_schema_is_sent_to_the_version_that_wrote_it(water_record,
                                                                          tmp_path):
    """It was sent to 'the version that wrote it, or a newer one', which cannot read it."""
    record = tmp_path / "past.h5"
    shutil.copy(water_record, record)
    with h5py.File(record, "r+") as h5:
        h5.attrs["schema"] = "dfmp2.run/0"
    with pytest.raises(InputError, match="read it with the version of dfmp2 that wrote it$"):
        read_record(record)


def test_a_record_of_a_newer_schema_says_so(run_cli, water_record, tmp_path):
    """A record another version of dfmp2 wrote (schema dfmp2.run/2) was called 'an HDF5 file
    but not a dfmp2 record', and a batch said 'choose another -o path'."""
    record = tmp_path / "future.h5"
    shutil.copy(water_record, record)
    with h5py.File(record, "r+") as h5:
        h5.attrs["schema"] = "dfmp2.run/2"
    newer = "is a dfmp2 record of schema dfmp2.run/2, which this version of dfmp2 does not read"
    shown = run_cli("show", record)
    assert shown.code == 2 and newer in shown.err
    rerun = run_cli("run", MOLECULES / "water.xyz", "--basis", "sto-3g", "-o", record)
    assert rerun.code == 2 and newer in rerun.err


def test_a_record_is_read_here_when_no_child_can_be_made(water_record, monkeypatch):
    """Under a process limit fork fails with EAGAIN: the record is read in this process."""
    from dfmp2.records import isolated

    def refused():
        raise BlockingIOError(11, "Resource temporarily unavailable")

    monkeypatch.setattr(isolated.os, "fork", refused)
    assert read_record(water_record).attrs["status"] == "complete"
