"""Temporary folders of a dfmp2 killed by SIGKILL: the next one of the kind removes them.

A SIGKILL runs no cleanup: bench's, the ASE calculator's and the QCSchema call's
``tempfile.TemporaryDirectory`` stayed in ``$TMPDIR`` for good, with the records and scratch
files in them, and so did geomeTRIC's (empty) working folder of every killed optimisation.
"""
from __future__ import annotations

import contextlib
import errno
import os
import signal
import subprocess
import sys
import tempfile
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from conftest import REPO, molecule_path
from dfmp2.system import orphans
from dfmp2.system.orphans import OwnedFolder

# A process that holds a folder of its own, made as dfmp2 makes them, until it is killed.
OWNER = textwrap.dedent("""
    import sys, time
    from dfmp2.system.orphans import OwnedFolder
    with OwnedFolder(sys.argv[1], sys.argv[2]) as folder:
        (folder / "record.h5").write_text("a record")
        print(folder, flush=True)
        time.sleep(120)
""")
# Prints this and waits when it reaches the step that holds the folder, to be killed there.
HOLDING = "holding"
HOLD = f"""
def hold(*args, **kwargs):
    import time
    print({HOLDING!r}, flush=True)
    time.sleep(120)
"""


def _child_env(tmpdir: Path) -> dict[str, str]:
    return {**os.environ, "TMPDIR": str(tmpdir), "OMP_NUM_THREADS": "1"}


@contextlib.contextmanager
def folder_owner(prefix: str, parent: Path) -> Iterator[tuple[subprocess.Popen, Path]]:
    """A live process and the folder it holds in ``parent``; killed on leaving."""
    process = subprocess.Popen([sys.executable, "-c", OWNER, prefix, str(parent)],
                               stdout=subprocess.PIPE, text=True, env=_child_env(parent))
    try:
        folder = Path(process.stdout.readline().strip())
        assert folder.parent == parent, "the owner made no folder"
        yield process, folder
    finally:
        process.kill()
        process.wait()
        process.stdout.close()


def kill_while_holding(script: str, tmpdir: Path) -> None:
    """Run ``script`` (which calls ``hold`` in the step that holds a folder) and SIGKILL it
    there."""
    process = subprocess.Popen([sys.executable, "-c", HOLD + textwrap.dedent(script)],
                               cwd=REPO, env=_child_env(tmpdir), stdout=subprocess.PIPE,
                               text=True)
    try:
        assert process.stdout.readline().strip() == HOLDING, "the step was never reached"
        assert process.poll() is None
    finally:
        process.send_signal(signal.SIGKILL)
        process.wait()
        process.stdout.close()


@pytest.fixture
def tmpdir_here(tmp_path, monkeypatch) -> Path:
    """This process's temporary folder, as tempfile finds it, a fresh one."""
    folder = tmp_path / "tmpdir"
    folder.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(folder))
    return folder


def _names(folder: Path) -> list[str]:
    return sorted(path.name for path in folder.iterdir())


def test_a_killed_optimisation_leaves_nothing_in_tmpdir(tmp_path):
    """geomeTRIC was given a TemporaryDirectory as its working folder, which it never writes
    to for our engine: a killed optimisation left it behind. No folder is made now."""
    tmpdir = tmp_path / "tmpdir"
    tmpdir.mkdir()
    kill_while_holding(f"""
        from dfmp2.input.xyz import read_xyz
        from dfmp2.jobs.optimize import StepLog, optimize
        from dfmp2.records.job_sections import Steps
        start = read_xyz({str(molecule_path("water"))!r})
        optimize(start, hold, StepLog(Steps.empty(start.natoms), print), "GAU", 5)
    """, tmpdir)
    assert _names(tmpdir) == []


@pytest.mark.usefixtures("single_thread")
def test_a_killed_bench_leaves_its_folder_to_the_next_bench(tmp_path, tmpdir_here, run_cli,
                                                            monkeypatch):
    from dfmp2.jobs import bench

    kill_while_holding(f"""
        from pathlib import Path
        from dfmp2.input.settings import RunSettings
        from dfmp2.jobs import bench
        bench._in_fresh_process = hold
        bench.bench_once(RunSettings(molecule=Path({str(molecule_path("water"))!r}),
                                     basis="sto-3g"), True)
    """, tmpdir_here)
    [killed] = tmpdir_here.iterdir()
    assert killed.name.startswith("dfmp2-bench-")
    # The side in this process: the folder is the command's, whichever process computes.
    monkeypatch.setattr(bench, "_in_fresh_process", lambda side, settings: side(settings))
    with folder_owner("dfmp2-bench-", tmpdir_here) as (_, live):
        result = run_cli("bench", molecule_path("water"), "--basis", "sto-3g", "--threads", "1",
                         "--skip-pyscf", "--repeat", "1", "-o", tmp_path / "b.h5")
        assert result.code == 0, result.err
        assert _names(tmpdir_here) == [live.name]
        assert _names(live) == ["record.h5"]


@pytest.mark.usefixtures("single_thread")
def test_a_killed_benchs_scratch_files_go_with_the_next_bench(tmp_path, tmpdir_here, run_cli,
                                                              monkeypatch):
    """With --scratch, a benchmark's scratch files were named after its record alone, in
    that folder: a SIGKILLed bench's stayed there for good. They are in a folder of the
    bench's own there now, which the next bench given that folder removes."""
    from dfmp2.jobs import bench

    scratch = tmp_path / "scratch"
    scratch.mkdir()
    kill_while_holding(f"""
        from pathlib import Path
        from dfmp2.input.settings import RunSettings
        from dfmp2.jobs import bench
        bench._in_fresh_process = hold
        bench.bench_once(RunSettings(molecule=Path({str(molecule_path("water"))!r}),
                                     basis="sto-3g", scratch=Path({str(scratch)!r})), True)
    """, tmpdir_here)
    [killed] = scratch.iterdir()
    assert killed.name.startswith("dfmp2-bench-")
    sides_scratch = []

    def in_this_process(side, settings):
        sides_scratch.append(settings.scratch)
        return side(settings)

    monkeypatch.setattr(bench, "_in_fresh_process", in_this_process)
    result = run_cli("bench", molecule_path("water"), "--basis", "sto-3g", "--threads", "1",
                     "--skip-pyscf", "--repeat", "1", "--scratch", scratch,
                     "-o", tmp_path / "b.h5")
    assert result.code == 0, result.err
    [own] = sides_scratch
    assert own.parent == scratch and own.name.startswith("dfmp2-bench-")
    assert _names(scratch) == []


@pytest.mark.usefixtures("single_thread")
def test_a_killed_ase_calculations_scratch_files_go_with_the_next_one(tmp_path, tmpdir_here):
    from ase import Atoms

    from dfmp2.interfaces.ase import DFMP2

    scratch = tmp_path / "scratch"
    scratch.mkdir()
    kill_while_holding(f"""
        from ase import Atoms
        from dfmp2.interfaces import ase
        ase.run_job.run = hold
        atoms = Atoms("H2", positions=[(0, 0, 0), (0, 0, 0.74)])
        atoms.calc = ase.DFMP2(basis="sto-3g", threads=1, scratch={str(scratch)!r})
        atoms.get_potential_energy()
    """, tmpdir_here)
    [killed] = scratch.iterdir()
    assert killed.name.startswith("dfmp2-ase-")
    atoms = Atoms("H2", positions=[(0, 0, 0), (0, 0, 0.74)])
    atoms.calc = DFMP2(basis="sto-3g", threads=1, scratch=str(scratch))
    assert atoms.get_potential_energy() < 0
    assert _names(scratch) == []


@pytest.mark.usefixtures("single_thread")
def test_a_killed_ase_calculation_leaves_its_folder_to_the_next_one(tmpdir_here):
    from ase import Atoms

    from dfmp2.interfaces.ase import DFMP2

    kill_while_holding("""
        from ase import Atoms
        from dfmp2.interfaces import ase
        ase.run_job.run = hold
        atoms = Atoms("H2", positions=[(0, 0, 0), (0, 0, 0.74)])
        atoms.calc = ase.DFMP2(basis="sto-3g", threads=1)
        atoms.get_potential_energy()
    """, tmpdir_here)
    [killed] = tmpdir_here.iterdir()
    assert killed.name.startswith("dfmp2-ase-")
    with folder_owner("dfmp2-ase-", tmpdir_here) as (_, live):
        atoms = Atoms("H2", positions=[(0, 0, 0), (0, 0, 0.74)])
        atoms.calc = DFMP2(basis="sto-3g", threads=1)
        assert atoms.get_potential_energy() < 0
        assert _names(tmpdir_here) == [live.name]
        assert _names(live) == ["record.h5"]


@pytest.mark.usefixtures("single_thread")
def test_a_killed_qcschema_call_leaves_its_folder_to_the_next_one(tmp_path):
    """The folder is in QCEngine's scratch_directory: the next call's sweep looks there."""
    import qcengine

    import dfmp2.qcengine  # noqa: F401  (registers the harness)

    scratch = tmp_path / "scratch"
    scratch.mkdir()
    task = {"molecule": {"symbols": ["H", "H"], "geometry": [0, 0, 0, 0, 0, 1.4]},
            "driver": "energy", "model": {"method": "mp2", "basis": "sto-3g"}}
    kill_while_holding(f"""
        import qcengine
        import dfmp2.qcengine
        from dfmp2.interfaces import qcschema
        qcschema.run_job.run = hold
        qcengine.compute({task!r}, "dfmp2", raise_error=True, return_version=2,
                         task_config={{"scratch_directory": {str(scratch)!r}, "ncores": 1}})
    """, tmp_path)
    [killed] = scratch.iterdir()
    assert killed.name.startswith("dfmp2-qcschema-")
    with folder_owner("dfmp2-qcschema-", scratch) as (_, live):
        result = qcengine.compute(task, "dfmp2", return_version=2,
                                  task_config={"scratch_directory": str(scratch), "ncores": 1})
        assert result.success, result.error
        assert _names(scratch) == [live.name]
        assert _names(live) == ["record.h5"]


def _ended_owners_folder(prefix: str, parent: Path) -> Path:
    """A folder whose owner was killed, with a file and a subfolder in it."""
    with folder_owner(prefix, parent) as (_, folder):
        (folder / "scratch").mkdir()
        (folder / "scratch" / ".run.h5.run.b0.bin").write_bytes(b"B")
    return folder


def test_a_folder_is_private_and_a_link_at_its_name_is_never_followed(tmp_path, monkeypatch):
    """A link planted at the name drawn for a folder is left alone, and another name is
    drawn."""
    target = tmp_path / "elsewhere"
    target.mkdir()
    tokens = iter(["0badf00d", "0badf00d", "12345678"])
    monkeypatch.setattr(orphans.secrets, "token_hex", lambda _: next(tokens))
    with OwnedFolder("dfmp2-test-", tmp_path) as first:
        first.rmdir()
        first.symlink_to(target, target_is_directory=True)
        with OwnedFolder("dfmp2-test-", tmp_path) as second:
            assert second.name.endswith("-12345678") and second.is_dir()
            assert not second.is_symlink()
            assert second.stat().st_mode & 0o777 == 0o700
            (second / "file").write_text("x")
        assert not second.exists()
        assert first.is_symlink()
    assert _names(target) == []


def test_only_this_users_real_folders_of_ended_owners_of_the_kind_are_removed(tmp_path):
    """The sweep never follows a link, never takes another user's folder, another machine's
    or another kind's, and tells a reused pid from its first process by its start time."""
    ended = _ended_owners_folder("dfmp2-test-", tmp_path)
    place, pid, started = ended.name.removeprefix("dfmp2-test-").split("-")[:3]
    other_kind = _ended_owners_folder("dfmp2-other-", tmp_path)
    (tmp_path / "elsewhere").mkdir()
    target = _ended_owners_folder("dfmp2-test-", tmp_path / "elsewhere")
    link = tmp_path / f"dfmp2-test-{place}-{pid}-{started}-feedbeef"
    link.symlink_to(target, target_is_directory=True)
    # In the ended owner's folder, a link is removed, not followed, and a FIFO never opened.
    (ended / "scratch" / "link").symlink_to(target, target_is_directory=True)
    os.mkfifo(ended / "fifo")
    # This test's own pid with another start time: the folder of an earlier process that had
    # the same pid.
    reused = tmp_path / f"dfmp2-test-{place}-{os.getpid()}-{int(started) + 1}-aaaaaaaa"
    reused.mkdir()
    other_machine = tmp_path / f"dfmp2-test-{'f' * 16}-{pid}-{started}-bbbbbbbb"
    other_machine.mkdir()
    others = []
    if os.getuid() == 0:
        others.append(_ended_owners_folder("dfmp2-test-", tmp_path))
        os.chown(others[0], 12345, 12345)
    with folder_owner("dfmp2-test-", tmp_path) as (_, live):
        with OwnedFolder("dfmp2-test-", tmp_path) as mine:
            assert sorted(tmp_path.iterdir()) == sorted(
                [mine, live, other_kind, link, other_machine, *others, target.parent])
            assert _names(target) == ["record.h5", "scratch"]
            assert _names(live) == ["record.h5"]


def test_an_owner_whose_process_entry_cannot_be_read_keeps_its_folder(tmp_path, monkeypatch):
    """An unreadable /proc entry (too many open files) was taken for an ended owner, and a
    live process's folder was removed under it."""
    with OwnedFolder("dfmp2-test-", tmp_path) as live:
        real_read = Path.read_text

        def unreadable(path, *args, **kwargs):
            if str(path).startswith("/proc/") and str(path).endswith("/stat"):
                raise OSError(errno.EMFILE, "Too many open files")
            return real_read(path, *args, **kwargs)

        monkeypatch.setattr(Path, "read_text", unreadable)
        _, pid, started = live.name.removeprefix("dfmp2-test-").split("-")[:3]
        assert not orphans.process_ended(int(pid), started)
        orphans._remove_ended_owners_folders(tmp_path, "dfmp2-test-", orphans._place()
                                             or "none")
        monkeypatch.undo()
        assert live.is_dir()


def test_a_folder_another_process_is_removing_too_is_removed_without_a_warning(
        tmp_path, monkeypatch, caplog):
    """Two processes sweeping one ended owner's folder: the slower warned of every file the
    other had removed first."""
    folder = tmp_path / "gone"
    (folder / "sub").mkdir(parents=True)
    (folder / "sub" / "file").write_text("x")
    (folder / "file").write_text("x")
    real_unlink = os.unlink

    def raced(name, *, dir_fd=None):
        real_unlink(name, dir_fd=dir_fd)
        raise FileNotFoundError(errno.ENOENT, "removed by the other process")

    monkeypatch.setattr(os, "unlink", raced)
    assert orphans._remove_folder(tmp_path, "gone")
    assert not folder.exists()
    assert not [r for r in caplog.records if r.levelname == "WARNING"]
