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

# Benzene/cc-pVDZ's SCF cycles take over a second on one thread: long enough to be killed in.
KILL_AFTER_SCF_START = 0.2  # s


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
         "cc-pvdz", "--backend", "torch", "--threads", "1", "-v", "-o", str(record)],
        cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        # The SCF's cycles start once its JK-fit tensor is built (the log says so); a fixed
        # wait after the record appeared was sometimes longer than the whole run.
        for line in process.stderr:
            if "JK tensor:" in line:
                break
        time.sleep(KILL_AFTER_SCF_START)
        assert process.poll() is None, "the run ended before it could be killed in its SCF"
    finally:
        process.send_signal(signal.SIGKILL)
        process.communicate()
    assert list(scratch.iterdir()) == []
