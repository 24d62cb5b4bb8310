"""PySCF leaves no file in its TMPDIR: dfmp2 turns off the SCF checkpoint file PySCF opens
there (the run record is the checkpoint), so even a SIGKILLed run leaves nothing behind."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time

from pyscf import lib

from conftest import REPO, molecule_path

# Benzene/cc-pVDZ's SCF takes several seconds on one thread: long enough to be killed in it.
KILL_AFTER_SCF_START = 1.5  # s
START_TIMEOUT = 60.0  # s


def test_a_run_leaves_nothing_in_pyscf_tmpdir(run_cli, tmp_path, monkeypatch):
    scratch = tmp_path / "tmpdir"
    scratch.mkdir()
    monkeypatch.setattr(lib.param, "TMPDIR", str(scratch))
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    result = run_cli("run", molecule_path("water"), "--backend", "torch", "--scf-engine",
                     "pyscf", "-o", tmp_path / "water.h5")
    assert result.code == 0, result.err
    assert list(scratch.iterdir()) == []


def test_a_killed_run_leaves_nothing_in_tmpdir(tmp_path):
    scratch = tmp_path / "tmpdir"
    scratch.mkdir()
    record = tmp_path / "benzene.h5"
    env = {k: v for k, v in os.environ.items() if k != "PYSCF_TMPDIR"}
    env["TMPDIR"] = str(scratch)
    process = subprocess.Popen(
        [sys.executable, "-m", "dfmp2", "run", str(molecule_path("benzene")), "--basis",
         "cc-pvdz", "--backend", "torch", "--threads", "1", "-o", str(record)],
        cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        # The record is first saved just before the SCF starts.
        deadline = time.monotonic() + START_TIMEOUT
        while not record.exists() and time.monotonic() < deadline and process.poll() is None:
            time.sleep(0.05)
        time.sleep(KILL_AFTER_SCF_START)
        assert process.poll() is None, "the run ended before it could be killed in its SCF"
    finally:
        process.send_signal(signal.SIGKILL)
        process.wait()
    assert list(scratch.iterdir()) == []
