"""The command line end to end: run, --json, the record, show, --check, python -m dfmp2."""
from __future__ import annotations

import contextlib
import errno
import io
import json
import pickle
import os
import signal
import subprocess
import time
from pathlib import Path

import h5py
import pytest
import torch

from conftest import (assert_ends_with, molecule_path, pyscf_df_rhf, pyscf_dfmp2_reference,
                      pyscf_molecule, python_exe)
from dfmp2.cli.options import environment_settings
from dfmp2.entry import drop_invalid_openmp_threads
from dfmp2.errors import Interrupted
from dfmp2.jobs.bench import _in_fresh_process

CONTRACT_JSON_KEYS = {"e_scf", "e_corr", "e_os", "e_ss", "e_scs", "e_tot", "record"}


@pytest.fixture(scope="module")
def water_reference():
    return pyscf_dfmp2_reference(pyscf_df_rhf(pyscf_molecule("water", "cc-pvdz")), 0)


def test_run_json_and_record(run_cli, tmp_path, water_reference):
    record = tmp_path / "water.h5"
    result = run_cli("run", molecule_path("water"), "--backend", "torch", "--json",
                     "-o", record)
    assert result.code == 0, result.err
    summary = json.loads(result.out)
    assert CONTRACT_JSON_KEYS <= summary.keys()
    assert abs(summary["e_corr"] - water_reference.e_corr) <= 1e-8
    assert summary["record"] == str(record)
    # What was computed, beside its energies (e_scs said nothing of its scales).
    assert (summary["scs_os"], summary["scs_ss"]) == (1.2, pytest.approx(1 / 3))
    assert {key: summary[key] for key in ("basis", "charge", "spin", "frozen", "reference")} == {
        "basis": "cc-pvdz", "charge": 0, "spin": 0, "frozen": 0, "reference": "rhf"}

    with h5py.File(record, "r") as h5:
        assert h5.attrs["schema"] == "dfmp2.run/1"
        assert h5.attrs["status"] == "complete"
        for key in ("e_corr", "e_os", "e_ss", "e_scs", "e_tot"):
            assert h5["mp2"].attrs[key] == pytest.approx(summary[key], abs=1e-12)
        assert h5["mp2"].attrs["e_scs"] == pytest.approx(
            1.2 * summary["e_os"] + summary["e_ss"] / 3, abs=1e-12)
        assert h5["scf"].attrs["converged"]
        assert h5["scf"].attrs["e_tot"] == pytest.approx(water_reference._scf.e_tot, abs=1e-8)
        for key in ("scf", "mp2", "total", "integrals", "fit", "energy"):
            assert h5["timings"].attrs[key] >= 0
        backend = h5["backend"].attrs
        assert backend["backend"] == "torch" and backend["precision"] == "fp64"
        assert backend["fallbacks"] == 0 and not backend["fused_energy"]
        assert backend["calls.syrk.torch-cpu"] == 1
        assert backend["calls.trsm.torch-cpu"] >= 1
        sizes = h5["sizes"].attrs
        assert (sizes["nao"], sizes["nocc"], sizes["nvir"], sizes["nfrozen"]) == (24, 5, 19, 0)
        assert sizes["naux"] == 84
        assert h5["input"].attrs["basis"] == "cc-pvdz"
        assert h5["input"].attrs["auxbasis"] == "cc-pvdz-ri"
        assert h5["input"].attrs["xyz"] == molecule_path("water").read_text()
        assert h5["scf/mo_energy"].shape == (24,)
        for key in ("dfmp2", "pyscf", "torch", "numpy"):
            assert h5["versions"].attrs[key]
        assert "dfmp2 run" in h5.attrs["command"] and h5.attrs["created"]
    assert not list(tmp_path.glob(".*.tmp")), "the atomic write left a temporary file"


def test_run_text_and_show(run_cli, tmp_path):
    record = tmp_path / "w.h5"
    result = run_cli("run", molecule_path("water"), "--backend", "torch", "--fused-energy",
                     "--frozen-core", "-o", record)
    assert result.code == 0, result.err
    assert "E_corr" in result.out and "record written to" in result.out
    shown = run_cli("show", record)
    assert shown.code == 0
    e_corr_line = next(line for line in shown.out.splitlines() if "E_corr" in line)
    assert e_corr_line in result.out
    dumped = run_cli("show", record, "--all")
    assert "calls.mp2_energy.torch-cpu = 1" in dumped.out
    assert "fused_energy = True" in dumped.out
    # Long values whole: `show` sends a reader to --all for each rank's stage seconds, which
    # were cut at 100 characters.
    with h5py.File(record, "r") as h5:
        builds = h5["scf_engine"].attrs["build_seconds"]
    assert len(builds) > 100 and f"build_seconds = {builds}" in dumped.out
    assert "SCS with" not in result.out and "settled" not in result.out


def test_scs_energies_of_other_scales_say_so(run_cli, tmp_path):
    """E_SCS of --scs-os 0.5 --scs-ss 2 was printed as if it were Grimme's."""
    result = run_cli("run", molecule_path("water"), "--basis", "sto-3g", "--scs-os", "0.5",
                     "--scs-ss", "2", "-o", tmp_path / "w.h5")
    assert result.code == 0, result.err
    assert "(SCS with os 0.5, ss 2, not Grimme's 1.2, 1/3)" in result.out


def test_check_passes_and_is_stored(run_cli, tmp_path):
    record = tmp_path / "hf.h5"
    result = run_cli("run", molecule_path("hydrogen_fluoride"), "--backend", "torch", "--check",
                     "--json", "-o", record)
    assert result.code == 0, result.err
    summary = json.loads(result.out)
    assert summary["check_passed"] is True
    assert abs(summary["delta_e_corr"]) <= 1e-8
    with h5py.File(record, "r") as h5:
        assert h5["reference"].attrs["passed"]
        assert h5["reference"].attrs["e_corr"] == pytest.approx(summary["e_corr"], abs=1e-8)


def test_python_dash_m_is_the_same_program(tmp_path):
    record = tmp_path / "w.h5"
    proc = subprocess.run([python_exe(), "-m", "dfmp2", "run", str(molecule_path("water")),
                           "--basis", "sto-3g", "--backend", "torch", "--json", "-o",
                           str(record)], capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["record"] == str(record)
    proc = subprocess.run([python_exe(), "-m", "dfmp2", "run", "missing.xyz"],
                          capture_output=True, text=True, check=False)
    assert proc.returncode == 2
    assert proc.stderr.startswith("Error:") and len(proc.stderr.strip().splitlines()) == 1


def test_a_run_started_with_standard_error_closed_completes(tmp_path):
    """Started with ``2>&-`` (a daemon, some schedulers' wrappers), the run failed at its
    progress bar after the SCF ('NoneType' object has no attribute 'isatty'), exit 1."""
    record = tmp_path / "w.h5"
    proc = subprocess.run([python_exe(), "-m", "dfmp2", "run", str(molecule_path("water")),
                           "--basis", "sto-3g", "--backend", "torch", "--json", "-o",
                           str(record)], stdout=subprocess.PIPE, text=True, check=False,
                          preexec_fn=lambda: os.close(2))
    assert proc.returncode == 0
    assert json.loads(proc.stdout)["record"] == str(record)
    with h5py.File(record, "r") as h5:
        assert h5.attrs["status"] == "complete"


class _FullDevice(io.StringIO):
    """A standard output on a full device (as /dev/full is)."""

    def write(self, text: str) -> int:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def test_a_result_that_standard_output_cannot_take_is_one_error_line(tmp_path):
    """stdout on a full device: the run is complete, but its result cannot be printed (a
    traceback from click's echo, exit 1)."""
    from dfmp2.cli import main

    record = tmp_path / "w.h5"
    err = io.StringIO()
    with (contextlib.redirect_stdout(_FullDevice()), contextlib.redirect_stderr(err),
          pytest.raises(SystemExit) as ended):
        main(["run", str(molecule_path("water")), "--basis", "sto-3g", "--backend", "torch",
              "-o", str(record)])
    assert ended.value.code == 1
    assert err.getvalue().strip().splitlines() == [
        "Error: cannot write the result to standard output: No space left on device"]
    with h5py.File(record, "r") as h5:
        assert h5.attrs["status"] == "complete"


def test_torch_out_of_memory_is_one_line_and_a_failed_record(run_cli, tmp_path, monkeypatch):
    """torch reports a failed allocation as a RuntimeError ("DefaultCPUAllocator: can't
    allocate memory"), which ended in a traceback and an 'internal error' record where
    numpy's MemoryError gives one line."""
    import dfmp2.jobs.stages as stages

    def allocate_too_much(*args, **kwargs):
        return torch.empty(2**45, dtype=torch.float64)

    monkeypatch.setattr(stages.mp2, "kernel", allocate_too_much)
    record = tmp_path / "w.h5"
    result = run_cli("run", molecule_path("water"), "--basis", "sto-3g", "-o", record)
    assert result.code == 1
    lines = result.err.strip().splitlines()
    assert lines[-1].startswith("Error: out of memory; lower --memory"), result.err
    assert "Traceback" not in result.err
    with h5py.File(record, "r") as h5:
        assert h5.attrs["status"] == "failed"
        assert h5.attrs["error"].startswith("out of memory")


@pytest.mark.parametrize("signum, loaded, local_rank", [(signal.SIGINT, "libtorch", "0"),
                                                        (signal.SIGTERM, "libtorch", "0"),
                                                        (signal.SIGTERM, "_multiarray_umath", "0"),
                                                        (signal.SIGINT, "_multiarray_umath", "0"),
                                                        (signal.SIGTERM, "libtorch", "1")])
def test_a_signal_while_the_program_starts_is_one_line_and_128_plus_its_number(
        tmp_path, signum, loaded, local_rank):
    """Once a library is mapped, Python is importing numpy, torch and PySCF, before the
    command's handlers exist: Ctrl-C used to print a KeyboardInterrupt traceback from inside
    an import, SIGTERM ended the process without a word, and later one raised inside numpy's
    import recursed into a RecursionError traceback, exit 1. (A fixed 0.5 s could land before
    the interpreter started on a loaded machine.) A later rank of a node (torchrun stopping
    it once the first rank failed) ends without the line, which the first rank prints."""
    record = tmp_path / "w.h5"
    proc = subprocess.Popen([python_exe(), "-m", "dfmp2", "run", str(molecule_path("water")),
                             "--basis", "sto-3g", "-o", str(record)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "LOCAL_RANK": local_rank,
                                 **({"RANK": "1", "WORLD_SIZE": "2"} if local_rank == "1" else {})})
    maps = Path(f"/proc/{proc.pid}/maps")
    deadline = time.monotonic() + 60
    while loaded not in maps.read_text() and time.monotonic() < deadline:
        time.sleep(0.002)
    proc.send_signal(signum)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 128 + signum, err
    expected = f"Error: {signum.name} while starting; nothing was run\n"
    if local_rank == "1":
        expected = ""
    assert err == expected and out == ""
    assert not record.exists()


def test_unusable_omp_num_threads_and_pyscf_max_memory_are_warnings_of_ours(tmp_path):
    """Each OpenMP runtime (torch's, PySCF's) printed its own "libgomp: Invalid value" and
    went on with its default, and PySCF's import ended in a ValueError traceback on a
    PYSCF_MAX_MEMORY of 'abc'; now dfmp2 says once what it ignores."""
    env = {**os.environ, "OMP_NUM_THREADS": "two", "PYSCF_MAX_MEMORY": "abc"}
    result = subprocess.run([python_exe(), "-m", "dfmp2", "--version"], capture_output=True,
                            text=True, env=env, timeout=120, check=False)
    assert result.returncode == 0, result.stderr
    assert result.stderr == (
        "dfmp2: WARNING: OMP_NUM_THREADS='two' is not a positive number of threads and is "
        "ignored; unset it or give one such as 2\n"
        "dfmp2: WARNING: PYSCF_MAX_MEMORY='abc' is not a whole number of megabytes and is "
        "ignored; unset it or give one such as 4000\n")


@pytest.mark.parametrize("variables, message", [
    ({"DFMP2_NKI_MODE": "junk"}, "DFMP2_NKI_MODE='junk' is not an NKI mode"),
    ({"DFMP2_NKI_MODE": "simulator"}, "NKI mode simulator unavailable"),
    ({"DFMP2_REQUIRE_NKI": "maybe"}, "DFMP2_REQUIRE_NKI='maybe' is neither on nor off"),
])
def test_nki_environment_variables_that_mean_nothing_are_one_line(variables, message, run_cli,
                                                                 tmp_path, monkeypatch):
    """They ended in an NkiUnavailable traceback (exit 1); DFMP2_REQUIRE_NKI=yes was off."""
    for name, value in variables.items():
        monkeypatch.setenv(name, value)
    result = run_cli("run", molecule_path("water"), "--basis", "sto-3g", "--backend", "nki",
                     "-o", tmp_path / "w.h5")
    assert result.code == 2 and message in result.err
    assert len(result.err.strip().splitlines()) == 1


@pytest.mark.parametrize("value, required", [("1", True), ("yes", True), ("On", True),
                                             ("0", False), ("no", False), ("", False)])
def test_require_nki_takes_the_usual_words_for_on_and_off(value, required, monkeypatch):
    monkeypatch.setenv("DFMP2_REQUIRE_NKI", value)
    assert environment_settings()["require_nki"] is required


@pytest.mark.parametrize("value,kept", [("2", True), (" 4 ", True), ("2,1", True),
                                        ("0", False), ("-1", False), ("", False),
                                        ("1.5", False), ("3x", False), ("2" + "0" * 20, False),
                                        (str(2**63 - 1), True), (str(2**63), False)])
def test_omp_num_threads_is_kept_exactly_when_libgomp_accepts_it(value, kept):
    environ = {"OMP_NUM_THREADS": value}
    warning = drop_invalid_openmp_threads(environ)
    assert (warning is None) == kept and ("OMP_NUM_THREADS" in environ) == kept


def test_small_memory_budget_runs_out_of_core(run_cli, tmp_path, water_reference):
    record = tmp_path / "w.h5"
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    # --check too: PySCF's DF-MP2 for it was held to the budget the process had outgrown,
    # and failed the finished run with MemoryError.
    result = run_cli("run", molecule_path("water"), "--backend", "torch", "--memory", "100kB",
                     "--scratch", scratch, "--check", "--json", "-o", record)
    assert result.code == 0, result.err
    assert abs(json.loads(result.out)["e_corr"] - water_reference.e_corr) <= 1e-10
    assert json.loads(result.out)["check_passed"]
    with h5py.File(record, "r") as h5:
        assert h5["plan"].attrs["out_of_core"]
        assert h5["plan"].attrs["occ_blocks"] > 1
    assert not list(scratch.iterdir())


@pytest.mark.parametrize("command", ["optimize", "interaction", "bench"])
def test_a_one_process_command_under_a_launcher_is_refused(run_cli, tmp_path, monkeypatch,
                                                           command):
    """Under torchrun every rank ran the whole job on one record: one was refused the lock,
    torchrun then stopped the other, and no result was left."""
    for name, value in {"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1",
                        "MASTER_PORT": "29500"}.items():
        monkeypatch.setenv(name, value)
    result = run_cli(command, molecule_path("water_dimer"), "--basis", "sto-3g",
                     "-o", tmp_path / "o.h5")
    assert result.code == 2 and "runs as one process" in result.err
    assert not (tmp_path / "o.h5").exists()


def test_fallbacks_count_the_scfs_too(run_cli, tmp_path):
    """--json and show counted the MP2 stage's NKI fallbacks alone: an SCF whose builds had
    all fallen back to torch said 0."""
    from dfmp2.records.report import json_summary
    from dfmp2.records.tree import read_record

    record = tmp_path / "w.h5"
    assert run_cli("run", molecule_path("water"), "--basis", "sto-3g", "--backend", "torch",
                   "--threads", "1", "-o", record).code == 0
    with h5py.File(record, "r+") as h5:
        h5["scf_engine"].attrs["fallbacks"] = 3
        h5["backend"].attrs["fallbacks"] = 1
    assert json_summary(read_record(record), str(record))["fallbacks"] == 4
    assert "fallbacks 4" in run_cli("show", record).out


def test_a_stop_in_a_benchmark_side_process_comes_back_as_a_stop():
    """A signal stops bench's side process too: its Interrupted did not load in the parent
    (no exit code), and the pool waiting for the side's result hung."""
    stop = pickle.loads(pickle.dumps(Interrupted("terminated by signal SIGTERM; x", 143)))
    assert (type(stop), str(stop), stop.exit_code) == (
        Interrupted, "terminated by signal SIGTERM; x", 143)
    with pytest.raises(Interrupted, match="a benchmark keeps no partial result") as raised:
        _in_fresh_process(_stopped_side, None)
    assert raised.value.exit_code == 143


def _stopped_side(settings):
    raise Interrupted("terminated by signal SIGTERM; what was finished is in the record", 143)


@pytest.mark.parametrize("variable, value", [("DFMP2_REQUIRE_NKI", "1"),
                                             ("DFMP2_NKI_MODE", "hardware")])
def test_nki_variables_on_a_torch_run_are_said_to_apply_to_nki_only(variable, value, run_cli,
                                                                    tmp_path, monkeypatch,
                                                                    caplog):
    """Asked for NKI, given torch (the default backend off Trainium): it ran without a word."""
    monkeypatch.setenv(variable, value)
    result = run_cli("run", molecule_path("water"), "--basis", "sto-3g", "--backend", "torch",
                     "-o", tmp_path / "w.h5")
    assert result.code == 0, result.err
    assert "apply to the NKI backend; this run uses torch" in caplog.text


def test_a_benchmark_side_process_ends_with_the_command(tmp_path):
    """A bench killed by SIGKILL (the OOM killer, kill -9) left its side computing a whole
    calculation for no one, its files in $TMPDIR for good."""
    script = ("import time\n"
              "from dfmp2.jobs.bench import _in_fresh_process\n"
              "_in_fresh_process(time.sleep, 120)\n")
    parent = subprocess.Popen([python_exe(), "-c", script])
    side = None
    for _ in range(600):
        side = next(iter(_children_of(parent.pid)), None)
        if side is not None:
            break
        time.sleep(0.05)
    assert side is not None, "no side process started"
    assert_ends_with(parent, side, "the side process")


def _children_of(pid: int) -> list[int]:
    children = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rpartition(")")[2].split()
        except OSError:
            continue
        # A spawn pool's worker is started through its resource tracker's sibling: take the
        # ones running Python's multiprocessing spawn.
        if int(fields[1]) == pid and "spawn_main" in _command_line(stat.parent):
            children.append(int(stat.parent.name))
    return children


def _command_line(proc: Path) -> str:
    try:
        return (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""
