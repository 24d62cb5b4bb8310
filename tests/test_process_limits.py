"""The process's own limits and surroundings end a command in one line: an address-space limit
(``ulimit -v``), a process limit that lets no thread start, a deleted current folder, a PySCF
configuration file that fails, and a complete record that cannot be moved aside."""
from __future__ import annotations

import functools
import json
import os
import pathlib
import resource
import subprocess

import h5py

from conftest import molecule_path, python_exe

WATER = str(molecule_path("water"))
# A run started where threading.Thread.start fails, as under a pids limit that the process
# has reached: Python's own error, from its own call.
NO_THREADS = """
import sys, threading

def refuse(self):
    raise RuntimeError("can't start new thread")

threading.Thread.start = refuse
from dfmp2.cli import main
main(sys.argv[1:])
"""


def _dfmp2(*args, cwd=None, env=None, limit_kb: int | None = None,
           code: list[str] | None = None) -> subprocess.CompletedProcess:
    def limited() -> None:
        if limit_kb is not None:
            resource.setrlimit(resource.RLIMIT_AS, (limit_kb * 1024, limit_kb * 1024))

    command = [python_exe(), *(code or ["-m", "dfmp2"]), *map(str, args)]
    return subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=300, preexec_fn=limited)


def _one_error_line(done: subprocess.CompletedProcess) -> str:
    lines = done.stderr.strip().splitlines()
    assert "Traceback" not in done.stderr and "Fatal Python error" not in done.stderr, done.stderr
    assert len(lines) == 1 and lines[0].startswith("Error: "), done.stderr
    return lines[0]


@functools.cache
def _mapped_after_import_kb() -> int:
    """What a process has mapped once the command line (torch, PySCF) is imported."""
    done = subprocess.run([python_exe(), "-c", "import dfmp2.cli; print(open('/proc/self/status')"
                           ".read().split('VmSize:')[1].split()[0])"],
                          capture_output=True, text=True, timeout=120, check=True)
    return int(done.stdout.strip())


def test_an_address_space_limit_too_small_to_load_or_to_compute_is_one_line(tmp_path):
    """Under ``ulimit -v``: too small to import torch and PySCF gave an import traceback (a
    MemoryError, a 'failed to map segment' ImportError); just enough to import them and not
    for BLAS's first product crashed the SCF guess (SIGSEGV) or ended in OpenBLAS's own
    message. Both are now one line, exit 2, before any record."""
    record = tmp_path / "w.h5"
    unloadable = _dfmp2("run", WATER, "--basis", "sto-3g", "-o", record, limit_kb=300_000)
    assert unloadable.returncode == 2
    assert "cannot be loaded within this process's address-space limit (ulimit -v 300000 kB)" \
        in _one_error_line(unloadable)

    tight = _mapped_after_import_kb() + 64 * 1024
    crowded = _dfmp2("run", WATER, "--basis", "cc-pvdz", "--threads", "1", "-o", record,
                     limit_kb=tight)
    assert crowded.returncode == 2
    assert "of address space is left under this process's limit" in _one_error_line(crowded)
    assert not record.exists()


def test_running_out_of_memory_under_an_address_space_limit_names_the_limit():
    """Memory that ran out under ``ulimit -v`` (in a narrow band: reading the XYZ file, before
    the headroom check) was 'lower --memory', with no --memory given."""
    from dfmp2.system.memory import limit_reached

    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    try:
        if hard == resource.RLIM_INFINITY:
            resource.setrlimit(resource.RLIMIT_AS, (resource.RLIM_INFINITY, hard))
            assert "lower --memory" in limit_reached(MemoryError())
            assert "ulimit -v" not in limit_reached(MemoryError())
        limit = 2**45 if hard == resource.RLIM_INFINITY else hard
        resource.setrlimit(resource.RLIMIT_AS, (limit, hard))
        assert f"address-space limit (ulimit -v {limit // 1024} kB); raise the limit" in \
            limit_reached(MemoryError())
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


def test_a_budget_above_the_address_space_limit_is_warned_of(tmp_path):
    """README: more than the job's limit is taken with a warning; ``ulimit -v`` was not
    compared with an explicit --memory."""
    limit = _mapped_after_import_kb() + 2 * 1024 * 1024
    done = _dfmp2("run", WATER, "--basis", "sto-3g", "--threads", "1", "--memory", "5GB",
                  "--json", "-o", tmp_path / "w.h5", limit_kb=limit)
    assert done.returncode == 0, done.stderr
    assert "--memory 5.0 GB is more than the" in done.stderr
    assert "may still map under its address-space limit (ulimit -v)" in done.stderr


def test_a_process_limit_lets_a_one_thread_run_finish_and_ends_others_in_one_line(run_cli,
                                                                                  tmp_path):
    """No thread can start (a pids limit reached): the energy step's read-ahead thread ended
    a --threads 1 run in 'internal error: RuntimeError' with a traceback. Reading ahead only
    saves time: the run now reads in turn, with the same energy; a run that needs threads
    for its products ends in one line naming the limit."""
    plain = run_cli("run", WATER, "--basis", "cc-pvdz", "--threads", "1", "--json",
                    "-o", tmp_path / "plain.h5")
    assert plain.code == 0, plain.err
    alone = _dfmp2("run", WATER, "--basis", "cc-pvdz", "--threads", "1", "--json",
                   "-o", tmp_path / "alone.h5", code=["-c", NO_THREADS])
    assert alone.returncode == 0, alone.stderr
    assert json.loads(alone.stdout)["e_tot"] == json.loads(plain.out)["e_tot"]

    record = tmp_path / "two.h5"
    two = _dfmp2("run", molecule_path("water_dimer"), "--basis", "cc-pvdz", "--threads", "2",
                 "-o", record, code=["-c", NO_THREADS])
    assert two.returncode == 1
    assert "process limit is reached" in _one_error_line(two)
    with h5py.File(record, "r") as h5:
        assert "process limit is reached" in h5.attrs["error"]


def test_a_deleted_current_folder_is_one_line(tmp_path):
    """MKL's loader failed inside torch's import: 'Intel oneMKL FATAL ERROR: Cannot load
    libtorch_cpu.so', exit 2, which blamed the installation."""
    gone = tmp_path / "gone"
    gone.mkdir()
    script = f"cd {gone} && rmdir {gone} && exec {python_exe()} -m dfmp2 show {tmp_path}/x.h5"
    done = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert "the current folder no longer exists" in _one_error_line(done)


def test_a_pyscf_configuration_file_that_fails_is_one_line(tmp_path):
    """PySCF runs PYSCF_CONFIG_FILE (or .pyscf_conf.py) when imported: a SyntaxError there was
    a traceback from deep inside the import."""
    config = tmp_path / "broken_conf.py"
    config.write_text("this is not python (\n")
    done = _dfmp2("run", WATER, "--basis", "sto-3g", "-o", tmp_path / "w.h5",
                  env={**os.environ, "PYSCF_CONFIG_FILE": str(config)})
    assert done.returncode == 2
    line = _one_error_line(done)
    assert f"PySCF's configuration file {config} fails to run (SyntaxError" in line


def test_a_complete_record_that_cannot_be_moved_aside_is_one_line(run_cli, water_record,
                                                                 tmp_path, monkeypatch):
    """A complete record that may not be renamed (immutable, or another user's in a sticky
    folder such as /tmp) gave a PermissionError traceback from the rename that sets it aside
    for a run of other options; the record is left as it was."""
    record = tmp_path / "w.h5"
    record.write_bytes(water_record.read_bytes())
    rename = pathlib.Path.rename

    def refused(self, target):
        if pathlib.Path(self) == record:
            raise PermissionError(1, "Operation not permitted", str(self))
        return rename(self, target)

    monkeypatch.setattr(pathlib.Path, "rename", refused)
    done = run_cli("run", WATER, "--basis", "6-31g", "-o", record)
    assert done.code == 2
    assert (f"cannot move the complete record {record} aside" in done.err
            and "(Operation not permitted)" in done.err), done.err
    assert record.read_bytes() == water_record.read_bytes()

