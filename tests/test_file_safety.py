"""Files beside a record and in scratch (issue 18): no write goes through a planted link, a
full disk at the lock, over-long and non-UTF-8 names, and FIFOs at the record path all end
with one `Error:` line (or, for odd but valid names, a run that works)."""
from __future__ import annotations

import errno
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import h5py
import pytest

import dfmp2
from conftest import molecule_path
from dfmp2.df.store import ScratchArea, open_store
from dfmp2.errors import InputError, RunFailure
from dfmp2.records.tree import read_record
from dfmp2.system.files import stage_text

TIMEOUT_SECONDS = 120
VICTIM_TEXT = "someone else's file\n"
# B of water out of core (a tiny budget, conventional SCF for speed), and the SCF's JK-fit
# tensor of the water dimer in scratch (6 MB holds the SCF but not that tensor).
WATER_B_OUT_OF_CORE = (molecule_path("water"), "--scf", "conventional", "--memory", "100KB",
                       "--backend", "torch")
DIMER_JK_IN_SCRATCH = (molecule_path("water_dimer"), "--memory", "6MB", "--backend", "torch")
QUICK = (molecule_path("water"), "--basis", "sto-3g", "--backend", "torch")


def one_error_line(stderr: str) -> str:
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error:"), stderr
    assert "Traceback" not in stderr
    return lines[0]


def victim(folder: Path) -> Path:
    path = folder / "victim.txt"
    path.write_text(VICTIM_TEXT)
    return path


def run_process(*args, cwd: Path) -> subprocess.CompletedProcess:
    """``dfmp2`` in its own process, stopped after a while: the old code hangs on a FIFO."""
    # The dfmp2 these tests import, whatever the folder it runs in.
    env = {**os.environ, "PYTHONPATH": str(Path(dfmp2.__file__).resolve().parents[1])}
    try:
        return subprocess.run([sys.executable, "-m", "dfmp2", *map(str, args)], cwd=cwd,
                              env=env, capture_output=True, text=True,
                              timeout=TIMEOUT_SECONDS)
    except subprocess.TimeoutExpired:
        pytest.fail(f"dfmp2 {' '.join(map(str, args))} hung")


# ------------------------------------------------------------------------------ links

# The record's lock; and the final geometry `dfmp2 optimize -o w.h5` writes to w.xyz, which
# a plain write_text wrote through a link, after the whole optimisation.
@pytest.mark.parametrize("command,planted", [("run", ".w.h5.lock"), ("optimize", "w.xyz")])
def test_a_link_at_a_name_dfmp2_writes_is_refused_and_its_target_untouched(tmp_path, run_cli,
                                                                           command, planted):
    target = victim(tmp_path)
    (tmp_path / planted).symlink_to(target)
    result = run_cli(command, *QUICK, "-o", tmp_path / "w.h5")
    assert result.code == 2
    assert f"{planted} is a symbolic link" in one_error_line(result.err)
    assert target.read_text() == VICTIM_TEXT
    assert not (tmp_path / "w.h5").exists()


def test_a_link_at_the_geometry_file_leaves_the_complete_optimisation_in_place(tmp_path,
                                                                                run_cli):
    """The link at w.xyz was refused only after the complete record had been set aside:
    nothing was left at -o, and the refusal did not say where the result went."""
    record = tmp_path / "w.h5"
    assert run_cli("optimize", *QUICK, "-o", record).code == 0
    target = victim(tmp_path)
    (tmp_path / "w.xyz").unlink()
    (tmp_path / "w.xyz").symlink_to(target)
    result = run_cli("optimize", *QUICK, "-o", record)
    assert result.code == 2
    assert "w.xyz is a symbolic link" in one_error_line(result.err)
    assert read_record(record).attrs["status"] == "complete"
    assert not list(tmp_path.glob("w.superseded-*")) and target.read_text() == VICTIM_TEXT


def test_a_linked_scratch_file_of_b_is_refused(tmp_path, run_cli):
    target = victim(tmp_path)
    for name in (".w.h5.run.b0.bin", ".w.h5.run.b0.raw.bin"):
        (tmp_path / name).symlink_to(target)
    result = run_cli("run", *WATER_B_OUT_OF_CORE, "-o", tmp_path / "w.h5")
    assert result.code == 2, result.err
    assert "is a symbolic link" in one_error_line(result.err)
    assert target.read_text() == VICTIM_TEXT
    assert (tmp_path / ".w.h5.run.b0.bin").is_symlink()


@pytest.mark.parametrize("engine", ["kernels", "pyscf"])
def test_a_linked_scratch_file_of_the_jk_tensor_is_refused(tmp_path, run_cli, engine):
    target = victim(tmp_path)
    for name in (".d.h5.run.jk.bin", ".d.h5.run.jk.raw.bin"):
        (tmp_path / name).symlink_to(target)
    result = run_cli("run", *DIMER_JK_IN_SCRATCH, "--scf-engine", engine,
                     "-o", tmp_path / "d.h5")
    assert result.code == 2, result.err
    assert ".jk" in one_error_line(result.err) and "symbolic link" in result.err
    assert target.read_text() == VICTIM_TEXT


def test_a_link_planted_after_pyscf_files_are_created_is_not_followed(tmp_path, run_cli,
                                                                     monkeypatch):
    """PySCF opens its JK tensor and DIIS files by name: a link that replaces the file dfmp2
    created, after the run's checks, must not redirect PySCF's writes (it wrote the tensor
    into the link's target)."""
    target = victim(tmp_path)
    pin = ScratchArea.pin
    planted = []

    def pin_then_plant(area, path):
        pinned = pin(area, path)
        path.unlink()
        path.symlink_to(target)
        planted.append(path.name)
        return pinned

    monkeypatch.setattr(ScratchArea, "pin", pin_then_plant)
    result = run_cli("run", molecule_path("water_dimer"), "--memory", "2MB", "--backend",
                     "torch", "--scf-engine", "pyscf", "--json", "-o", tmp_path / "d.h5")
    # HDF5 cannot name a file whose only entry is gone: the run fails, or PySCF writes the
    # file dfmp2 holds open; never the link's target.
    assert result.code == 1, result.err
    assert "JK-fit tensor file" in one_error_line(result.err)
    assert ".d.h5.run.jk.bin" in planted
    assert target.read_text() == VICTIM_TEXT
    assert not [name for name in planted if (tmp_path / name).exists()
                or (tmp_path / name).is_symlink()]


def test_scratch_files_are_never_opened_through_a_link(tmp_path):
    """Beneath the run's check: a link appearing at a scratch name later is still refused."""
    target = victim(tmp_path)
    area = ScratchArea(tmp_path, "r.h5.run")
    for path in (area.path(0), area.jk_path()):
        path.symlink_to(target)
    with pytest.raises(InputError, match="symbolic link"):
        open_store(4, 4, area.path(0))
    with pytest.raises(InputError, match="symbolic link"):
        area.pin(area.jk_path())
    assert target.read_text() == VICTIM_TEXT
    stale = area.named("gamma0")
    stale.write_bytes(b"an earlier run's")
    pinned = area.pin(stale)
    assert stale.stat().st_size == 0
    pinned.remove()
    assert not stale.exists()


def test_a_linked_record_path_is_refused(tmp_path, run_cli):
    record = tmp_path / "w.h5"
    record.symlink_to(tmp_path / "elsewhere.h5")
    result = run_cli("run", *QUICK, "-o", record)
    assert result.code == 2
    assert "w.h5 is a symbolic link; dfmp2 does not write through links" in \
        one_error_line(result.err)
    assert record.is_symlink() and not (tmp_path / "elsewhere.h5").exists()


# -------------------------------------------------------------------------- full disk

def test_a_full_disk_at_the_lock_is_one_line_and_leaves_no_lock(tmp_path, run_cli,
                                                                monkeypatch):
    real_write = os.write
    pid_line = f"{os.getpid()}\n".encode()

    def full_disk(fd: int, data) -> int:
        if bytes(data) == pid_line:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real_write(fd, data)

    monkeypatch.setattr(os, "write", full_disk)
    result = run_cli("run", *QUICK, "-o", tmp_path / "w.h5")
    assert result.code in (1, 2)
    assert "No space left on device" in one_error_line(result.err)
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_a_lock_file_this_user_cannot_open_says_what_to_do(tmp_path, run_cli, monkeypatch):
    """Another user's lock file, left by their killed run in a shared or sticky folder, ended
    the run with 'Permission denied' and status 1, without a word on what to do."""
    real_open = os.open
    lock = tmp_path / ".w.h5.lock"
    lock.touch()

    def another_users(path, flags, mode=0o777, **options):
        if Path(path) == lock:
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(path))
        return real_open(path, flags, mode, **options)

    monkeypatch.setattr(os, "open", another_users)
    result = run_cli("run", *QUICK, "-o", tmp_path / "w.h5")
    assert result.code == 2, result.err
    line = one_error_line(result.err)
    assert "Permission denied" in line and "choose another -o" in line
    assert sorted(p.name for p in tmp_path.iterdir()) == [".w.h5.lock"]


@pytest.mark.parametrize("code", [errno.ENOSYS, errno.ENOLCK])
def test_a_file_system_without_locks_is_one_line_and_leaves_no_lock(tmp_path, run_cli,
                                                                    monkeypatch, code):
    """Lustre mounted with noflock refuses flock with ENOSYS, NFS without its lock daemon with
    ENOLCK: the run ended in a traceback."""
    from dfmp2.records import lock

    def unsupported(fd: int, operation: int) -> None:
        raise OSError(code, os.strerror(code))

    monkeypatch.setattr(lock.fcntl, "flock", unsupported)
    result = run_cli("run", *QUICK, "-o", tmp_path / "w.h5")
    assert result.code == 1, result.err
    line = one_error_line(result.err)
    assert os.strerror(code) in line and "does not support file locks" in line
    assert sorted(p.name for p in tmp_path.iterdir()) == []


# ------------------------------------------------------------------------ long names

@pytest.mark.skipif(os.pathconf("/tmp", "PC_NAME_MAX") != 255, reason="NAME_MAX is not 255")
@pytest.mark.parametrize("size,fragment", [(250, "too long by 29 bytes"),
                                           (300, "is 300 bytes, longer than the 255")])
def test_a_record_name_too_long_is_refused_with_the_reason(tmp_path, run_cli, size,
                                                           fragment):
    record = tmp_path / ("r" * (size - 3) + ".h5")
    result = run_cli("run", *QUICK, "-o", record)
    assert result.code == 2
    line = one_error_line(result.err)
    assert fragment in line and "choose a shorter -o" in line
    assert list(tmp_path.iterdir()) == []


# --------------------------------------------------------------------- non-UTF-8 names

def test_names_that_are_not_utf8_are_kept_exactly(tmp_path, run_cli, monkeypatch):
    monkeypatch.chdir(tmp_path)
    molecule, record = b"caf\xe9.xyz", b"r\xe9sultat.h5"
    shutil.copy(molecule_path("water"), molecule)
    result = run_cli("run", os.fsdecode(molecule), "--basis", "sto-3g", "--backend", "torch",
                     "-o", os.fsdecode(record), "--json")
    assert result.code == 0, result.err
    assert json.loads(result.out)["status"] == "complete"
    root = read_record(os.fsdecode(record))
    assert root.groups["input"].attrs["source"] == os.fsdecode(molecule)
    assert os.fsdecode(record) in root.attrs["command"]
    with h5py.File(record, "r") as h5:
        assert h5["input"].attrs["source"] == os.fsdecode(molecule)
    for command in (["show"], ["show", "--all"], ["compare", "--json"]):
        shown = run_cli(*command, os.fsdecode(record))
        assert shown.code == 0 and "Traceback" not in shown.err, (command, shown.err)
    assert "caf\\xe9.xyz" in run_cli("show", os.fsdecode(record)).out
    assert sorted(os.listdir(b".")) == sorted([molecule, record])


# --------------------------------------------------------------------------- FIFOs

def test_a_fifo_at_the_record_path_is_refused(tmp_path):
    os.mkfifo(tmp_path / "fifo.h5")
    result = run_process("run", *QUICK, "-o", "fifo.h5", cwd=tmp_path)
    assert result.returncode == 2
    assert "fifo.h5 is a FIFO (named pipe), not a regular file" in \
        one_error_line(result.stderr)


@pytest.mark.parametrize("command", ["show", "compare"])
def test_a_fifo_given_to_show_or_compare_is_refused(tmp_path, command):
    os.mkfifo(tmp_path / "fifo.h5")
    result = run_process(command, "fifo.h5", cwd=tmp_path)
    assert result.returncode == 2
    assert "fifo.h5 is a FIFO (named pipe)" in one_error_line(result.stderr)


@pytest.mark.parametrize("name", ["*.h5", "[x].h5", "?.h5"])
def test_a_record_name_is_not_a_pattern(name, run_cli, tmp_path, monkeypatch):
    """`-o '*.h5'` (or '[x].h5', '?.h5'): the clean-up of an earlier run's temporaries and
    scratch files takes the files of that name only. The names were used as glob patterns,
    so such a run deleted other records' temporaries and a killed run's reusable B."""
    from dfmp2.df.store import ScratchArea
    from dfmp2.records.tree import stale_temporaries

    others = [tmp_path / ".x.h5.0123abcd.tmp", tmp_path / ".x.h5.run.b0.bin",
              tmp_path / ".x.h5.run.jk.bin"]
    for path in others:
        path.write_bytes(b"another run's")
    own = tmp_path / f".{name}.89abcdef.tmp"
    own.write_bytes(b"left by this record")
    assert stale_temporaries(tmp_path / name) == [own]
    assert ScratchArea(tmp_path, f"{name}.run").leftovers() == []
    monkeypatch.chdir(tmp_path)
    result = run_cli("run", molecule_path("water"), "--basis", "sto-3g", "-o", name)
    assert result.code == 0, result.err
    assert all(path.read_bytes() == b"another run's" for path in others)
    assert not own.exists()


def test_a_record_is_as_readable_as_the_umask_allows(run_cli, tmp_path):
    """Records were created 0600, so colleagues in a shared project folder could not read
    them whatever the user's umask."""
    previous = os.umask(0o022)
    try:
        result = run_cli("run", molecule_path("water"), "--basis", "sto-3g", "--backend",
                         "torch", "--threads", "1", "-o", tmp_path / "w.h5")
    finally:
        os.umask(previous)
    assert result.code == 0, result.err
    assert (tmp_path / "w.h5").stat().st_mode & 0o777 == 0o644


def test_a_folder_at_the_lock_name_is_bad_input(run_cli, tmp_path):
    (tmp_path / ".w.h5.lock").mkdir()
    result = run_cli("run", molecule_path("water"), "--basis", "sto-3g", "-o", tmp_path / "w.h5")
    assert result.code == 2 and "the lock file" in result.err and "is a folder" in result.err


@pytest.fixture
def bench_side_here(monkeypatch):
    """bench's side run in this process: the tests using it are of the record's handling,
    not of the side process (tests/test_cli.py has those), and a spawned side costs seconds."""
    from dfmp2.jobs import bench

    monkeypatch.setattr(bench, "_in_fresh_process", lambda side, settings: side(settings))


@pytest.mark.usefixtures("bench_side_here")
def test_bench_never_replaces_a_record_of_another_command(run_cli, tmp_path):
    """bench wrote its record over whatever was at -o: a complete run record was lost without
    a word, and it took no lock. Another command's record is now refused before any work, and
    an earlier benchmark moves aside."""
    record = tmp_path / "r.h5"
    args = (molecule_path("water"), "--basis", "sto-3g", "--threads", "1")
    assert run_cli("run", *args, "-o", record).code == 0
    refused = run_cli("bench", *args, "--skip-pyscf", "--repeat", "1", "-o", record)
    assert refused.code == 2
    assert "holds a dfmp2.run/1 record, not a dfmp2.bench/1 one" in refused.err
    assert read_record(record).attrs["schema"] == "dfmp2.run/1"
    bench = tmp_path / "b.h5"
    for _ in range(2):
        assert run_cli("bench", *args, "--skip-pyscf", "--repeat", "1", "-o", bench).code == 0
    assert read_record(bench).attrs["schema"] == "dfmp2.bench/1"
    assert [p.name.startswith("b.superseded-") for p in tmp_path.glob("b.*.h5")] == [True]


@pytest.mark.parametrize("command", ["properties", "frequencies"])
def test_molden_never_replaces_a_record(run_cli, tmp_path, command):
    """--molden naming a complete record (another job's) replaced it with the Molden text,
    without a word: an HDF5 file there is refused before any work."""
    record = tmp_path / "w.h5"
    assert run_cli("run", *QUICK, "--threads", "1", "-o", record).code == 0
    before = record.read_bytes()
    result = run_cli(command, *QUICK, "--threads", "1", "-o", tmp_path / "p.h5",
                     "--molden", record)
    assert result.code == 2
    assert "w.h5 is an HDF5 file (a dfmp2 record?)" in one_error_line(result.err)
    assert record.read_bytes() == before and not (tmp_path / "p.h5").exists()


@pytest.mark.parametrize("plant", ["user block", "link at the temporary"])
def test_a_molden_target_is_checked_whole_before_any_work(run_cli, tmp_path, plant):
    """An HDF5 file whose signature follows a user block (a MATLAB v7.3 file) was replaced;
    a link at the Molden file's temporary name stopped properties only after its whole
    calculation, which the failed record then lacked."""
    target = tmp_path / "w.molden"
    if plant == "user block":
        with h5py.File(target, "w", userblock_size=512) as h5:
            h5["data"] = list(range(10))
        fragment = "w.molden is an HDF5 file"
    else:
        target = tmp_path / "new.molden"
        victim(tmp_path)
        (tmp_path / ".new.molden.tmp").symlink_to(tmp_path / "victim.txt")
        fragment = ".new.molden.tmp is a symbolic link"
    before = target.read_bytes() if target.exists() else None
    result = run_cli("properties", *QUICK, "--threads", "1", "-o", tmp_path / "p.h5",
                     "--molden", target)
    assert result.code == 2
    assert fragment in one_error_line(result.err)
    assert not (tmp_path / "p.h5").exists()
    assert (target.read_bytes() if target.exists() else None) == before
    if plant != "user block":
        assert (tmp_path / "victim.txt").read_text() == VICTIM_TEXT


def test_the_optimised_geometry_never_replaces_a_record(run_cli, tmp_path):
    """A complete record named o.xyz was replaced by the geometry of `optimize -o o.h5`."""
    geometry = tmp_path / "o.xyz"
    assert run_cli("run", *QUICK, "--threads", "1", "-o", geometry).code == 0
    before = geometry.read_bytes()
    result = run_cli("optimize", *QUICK, "--threads", "1", "-o", tmp_path / "o.h5")
    assert result.code == 2
    assert "o.xyz is an HDF5 file (a dfmp2 record?)" in one_error_line(result.err)
    assert geometry.read_bytes() == before and not (tmp_path / "o.h5").exists()


def test_the_optimised_geometry_never_replaces_another_molecules_file(run_cli, tmp_path):
    """`optimize hf.xyz -o water.h5` beside water.xyz replaced that molecule's file with the
    optimised HF without a word. The final geometry of the complete record at -o still goes
    aside with that record when it is rerun."""
    other = tmp_path / "w.xyz"
    shutil.copy(molecule_path("ammonia"), other)
    before = other.read_bytes()
    record = tmp_path / "w.h5"
    args = ("optimize", *QUICK, "--threads", "1", "-o", record)
    result = run_cli(*args)
    assert result.code == 2
    assert "is not the final geometry of the record" in one_error_line(result.err)
    assert other.read_bytes() == before and not record.exists()
    other.unlink()
    assert run_cli(*args).code == 0
    rerun = run_cli(*args, "--convergence", "GAU_TIGHT")
    assert rerun.code == 0, rerun.err
    assert other.read_text().splitlines()[1].endswith("optimised by dfmp2")


def test_a_batch_leaves_a_dangling_link_at_a_record_name_alone(run_cli, tmp_path):
    """The batch refused the link, then put its 'failed' record where the link was, which the
    error line told the user to remove."""
    out = tmp_path / "out"
    out.mkdir()
    (out / "water-sto-3g.h5").symlink_to(tmp_path / "nothere")
    result = run_cli("batch", molecule_path("water"), "--basis", "sto-3g", "--threads", "1",
                     "--out", out)
    assert result.code == 1 and "is a symbolic link" in result.err
    assert (out / "water-sto-3g.h5").is_symlink() and not (tmp_path / "nothere").exists()


@pytest.mark.parametrize("command", ["properties", "frequencies"])
def test_molden_into_a_folder_that_cannot_be_written_is_refused_before_any_work(
        run_cli, tmp_path, command, monkeypatch):
    """frequencies checked only that the --molden folder existed, then ended a finished
    calculation with a traceback when the folder could not be written."""
    folder = tmp_path / "read-only"
    folder.mkdir()
    folder.chmod(0o555)
    # Root writes into any folder: it is told, as a user would be, that this one is not.
    access = os.access
    monkeypatch.setattr(os, "access", lambda path, mode, **options: (
        not mode & os.W_OK and access(path, mode, **options)) if Path(path) == folder
        else access(path, mode, **options))
    result = run_cli(command, *QUICK, "--threads", "1", "-o", tmp_path / "p.h5",
                     "--molden", folder / "w.molden")
    assert result.code == 2
    assert "is not a writable folder; choose another --molden" in one_error_line(result.err)
    assert not (tmp_path / "p.h5").exists()


def test_a_failed_text_output_leaves_the_earlier_file_whole(tmp_path):
    """A full disk while writing a Molden or geometry file left it truncated: the text is
    written beside the target and renamed onto it only when complete."""
    target = tmp_path / "w.molden"
    target.write_text("the earlier file\n")

    def write_until_full(handle):
        handle.write("half of it")
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    with pytest.raises(RunFailure, match="No space left on device; free some space"):
        stage_text(target, write_until_full, "choose another --molden")
    assert target.read_text() == "the earlier file\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["w.molden"]
    staged = stage_text(target, lambda handle: handle.write("the new file\n"),
                        "choose another --molden")
    assert target.read_text() == "the earlier file\n", "in place only once committed"
    staged.discard()
    assert target.read_text() == "the earlier file\n"
    stage_text(target, lambda handle: handle.write("the new file\n"),
               "choose another --molden").commit()
    assert target.read_text() == "the new file\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["w.molden"]


@pytest.mark.usefixtures("bench_side_here")
def test_a_bench_that_cannot_write_its_record_shows_its_measurements_and_puts_back_the_last(
        run_cli, tmp_path, monkeypatch):
    """On a full disk the earlier benchmark record stayed under its superseded name without a
    word, and the measurements just made were neither printed nor kept."""
    from dfmp2.jobs import bench
    from dfmp2.records.tree import RecordWriteError

    record = tmp_path / "b.h5"
    args = ("bench", molecule_path("water"), "--basis", "sto-3g", "--threads", "1",
            "--skip-pyscf", "-o", record)
    assert run_cli(*args).code == 0
    before = record.read_bytes()

    def full_disk(path, root):
        raise RecordWriteError(f"cannot write the run record {path}: No space left on device")

    monkeypatch.setattr(bench, "write_record", full_disk)
    result = run_cli(*args)
    assert result.code == 1
    assert "MP2 energy step:" in result.out and "record: not written" in result.out
    assert result.err.strip() == (f"Error: cannot write the run record {record}: No space left "
                                  f"on device (the earlier benchmark record is back at {record})")
    assert record.read_bytes() == before and list(tmp_path.glob("b.*.h5")) == []


def test_bad_input_that_only_the_bench_side_finds_is_bad_input(run_cli, tmp_path):
    """A memory budget too small for the SCF was found in the benchmark's side process and
    ended as 'benchmark side dfmp2_side failed', exit 1, where `run` exits 2."""
    result = run_cli("bench", molecule_path("water"), "--basis", "sto-3g", "--threads", "1",
                     "--skip-pyscf", "--memory", "1KB", "-o", tmp_path / "b.h5")
    assert result.code == 2 and "benchmark side" not in result.err
    assert "memory budget 1.0 kB is too small" in result.err


@pytest.mark.usefixtures("bench_side_here")
def test_a_bench_whose_earlier_record_cannot_be_moved_keeps_its_measurements_shown(
        run_cli, tmp_path, monkeypatch):
    """An earlier record that cannot be moved aside (immutable, another user's in /tmp) was
    found after every repeat: no table, 'so nothing was run', exit 2."""
    from dfmp2.jobs import bench
    from dfmp2.records.checkpoint import CannotSetAside

    record = tmp_path / "b.h5"
    args = ("bench", molecule_path("water"), "--basis", "sto-3g", "--threads", "1",
            "--skip-pyscf", "-o", record)
    assert run_cli(*args).code == 0
    before = record.read_bytes()

    def immutable(path, previous, kind="superseded"):
        raise CannotSetAside(f"cannot move the complete record {path} aside", "Operation not "
                             "permitted")

    monkeypatch.setattr(bench, "set_aside", immutable)
    result = run_cli(*args)
    assert result.code == 1 and "MP2 energy step:" in result.out
    assert result.err.strip() == (f"Error: the earlier benchmark record {record} cannot be "
                                  "moved aside (Operation not permitted), so this benchmark's "
                                  "record was not written; move it yourself, or give another -o")
    assert record.read_bytes() == before


def test_a_full_scratch_file_system_keeps_its_reason(run_cli, tmp_path, monkeypatch):
    """ENOSPC (and a quota, the open-file limits) were told 'no file can be created in it',
    as if the folder were the fault, while /proc's ENOENT is."""
    import errno
    from dfmp2.jobs import preamble

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(preamble.tempfile, "TemporaryFile", full)
    result = run_cli("run", molecule_path("water"), "--basis", "sto-3g", "--scratch", tmp_path,
                     "-o", tmp_path / "w.h5")
    assert result.code == 2 and (f"no file can be created in the scratch folder {tmp_path} (No "
                                 "space left on device); free some space") in result.err
