"""Two CPU ranks (gloo) under torchrun: same energy as one process, both ranks' blocks in the
record, resume across world sizes, and a dead rank ends the job instead of hanging."""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import tempfile
import threading
import time
from pathlib import Path

import h5py
import numpy as np
import pytest

from conftest import (CliResult, as_interrupted, molecule_path, python_exe, run_in_process,
                      stored_orbitals_e_corr)
from dfmp2.errors import InputError, RunFailure
from dfmp2.records.tree import read_record
from dfmp2.system.distributed import PeerWatch, _wait
from dfmp2.system.orphans import process_state

JOB_TIMEOUT_SECONDS = 240


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def torchrun(nproc: int, *args: str, command: str = "run") -> list[str]:
    return [python_exe(), "-m", "torch.distributed.run", "--nproc-per-node", str(nproc),
            "--master-addr", "127.0.0.1", "--master-port", str(free_port()),
            "-m", "dfmp2", command, *map(str, args)]


def on_ranks(nranks: int, command: str, *args, program: list[str] | None = None,
             variables: dict[str, str] | None = None, waited: int | None = None) -> CliResult:
    """``dfmp2 COMMAND ARGS`` (or ``program COMMAND ARGS``) on ``nranks`` ranks started as
    ``srun`` starts a step's tasks (one process each, told its rank by SLURM_PROCID), or in
    this process for one (the single process a distributed result is checked against), with
    the environment's ``variables``. Without torchrun's own interpreter in front, a job
    starts about 2 s sooner; the torchrun tests are in this file. The output is every
    rank's, rank 0's first. With ``waited``, only the first ``waited`` ranks are waited for
    and the others killed then (a rank that never ends by itself)."""
    if nranks == 1:
        return run_in_process(command, *args)
    port = str(free_port())
    base = {name: value for name, value in {**environment(), **(variables or {})}.items()
            if name not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE")}
    with tempfile.TemporaryDirectory() as folder:
        streams = [(Path(folder) / f"{r}.out", Path(folder) / f"{r}.err") for r in range(nranks)]
        ranks = []
        for rank, (out, err) in enumerate(streams):
            with open(out, "w") as stdout, open(err, "w") as stderr:
                ranks.append(subprocess.Popen(
                    [*(program or [python_exe(), "-m", "dfmp2"]), command, *map(str, args)],
                    stdout=stdout,
                    stderr=stderr, env={**base, "SLURM_PROCID": str(rank),
                                        "SLURM_LOCALID": str(rank),
                                        "SLURM_STEP_NUM_TASKS": str(nranks),
                                        "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port}))
        try:
            codes = [rank.wait(timeout=JOB_TIMEOUT_SECONDS) for rank in ranks[:waited]]
        finally:
            for rank in ranks:
                rank.kill()
        return CliResult(next((code for code in codes if code), 0),
                         "".join(out.read_text() for out, _ in streams),
                         "".join(err.read_text() for _, err in streams))


def rank_reports(script: str, folder, nranks: int) -> list[dict]:
    """Run ``script`` (a test module that is also a torchrun script writing
    ``rank<r>.json`` into ``folder``) on ``nranks`` ranks; every rank's report."""
    command = [python_exe(), "-m", "torch.distributed.run", "--nproc-per-node", str(nranks),
               "--master-addr", "127.0.0.1", "--master-port", str(free_port()), script,
               str(folder)]
    job = subprocess.run(command, capture_output=True, text=True, timeout=JOB_TIMEOUT_SECONDS,
                         env=environment())
    assert job.returncode == 0, job.stderr
    return [json.loads((folder / f"rank{r}.json").read_text()) for r in range(nranks)]


def environment() -> dict:
    return {**os.environ, "OMP_NUM_THREADS": "1", "DFMP2_DIST_TIMEOUT": "60"}


def test_two_ranks_match_pyscf_on_their_orbitals(tmp_path):
    """The energy's pairs dealt to two ranks (their SCF against one process's is
    test_distributed_scf's): PySCF's DF-MP2 on the orbitals the ranks' SCF stored."""
    args = [molecule_path("water_dimer"), "--basis", "cc-pvdz", "--backend", "torch",
            "--occ-block", "2", "--threads", "1", "--json"]
    record = tmp_path / "two.h5"
    double = subprocess.run(torchrun(2, *args, "-o", record), capture_output=True, text=True,
                            timeout=JOB_TIMEOUT_SECONDS, env=environment())
    assert double.returncode == 0, double.stderr
    lines = [line for line in double.stdout.splitlines() if line.strip()]
    assert len(lines) == 1, "only rank 0 prints"
    reference = stored_orbitals_e_corr(record, "water_dimer")
    assert abs(json.loads(lines[0])["e_corr"] - reference) <= 1e-10
    with h5py.File(record, "r") as h5:
        dist = h5["distributed"].attrs
        assert dist["world_size"] == 2 and dist["backend"] == "gloo"
        pairs = [json.loads(dist[f"rank{r}.pairs"]) for r in (0, 1)]
        assert pairs[0] and pairs[1], "both ranks computed block pairs"
        assert len(pairs[0]) + len(pairs[1]) == 5 * 6 // 2
        # The kernel ledger counts every rank's calls (it held rank 0's alone, so another
        # rank's NKI fallbacks left no trace).
        assert h5["backend"].attrs["calls.mp2_energy.torch-cpu"] == 5 * 6 // 2
        for rank in (0, 1):
            stages = json.loads(dist[f"rank{rank}.stage_seconds"])
            assert {"scf", "jk_tensor", "integrals", "fit", "energy"} <= set(stages), stages
            assert all(seconds >= 0 for seconds in stages.values())
            assert dist[f"rank{rank}.peak_rss_mb"] > 50
        assert h5["plan"].attrs["out_of_core"]
    assert not list(tmp_path.glob(".two.h5.*"))


SLOWED = """
import importlib
import os
import sys
import time

from dfmp2.entry import main

owner = importlib.import_module({module!r})
for part in {path!r}[:-1]:
    owner = getattr(owner, part)
original = getattr(owner, {path!r}[-1])
slowed = []


def slowed_call(*args, **kwargs):
    if not slowed and ({condition}):
        slowed.append(True)
        time.sleep({seconds})
    return original(*args, **kwargs)


setattr(owner, {path!r}[-1], slowed_call)
sys.argv[0] = "dfmp2"
main()
"""


def slowed_program(folder: Path, target: str, condition: str = "True",
                   seconds: float = 3) -> list[str]:
    """A dfmp2 program whose function ``target`` ('module:attribute.path') takes ``seconds``
    more the first time ``condition`` (a Python expression of ``args``, ``kwargs`` and
    ``os``) holds: a rank kept at work longer than DFMP2_DIST_TIMEOUT."""
    module, attributes = target.split(":")
    script = folder / "slowed.py"
    script.write_text(SLOWED.format(module=module, path=attributes.split("."),
                                    condition=condition, seconds=seconds))
    return [python_exe(), str(script)]


def test_a_check_longer_than_the_timeout_completes_on_ranks(tmp_path):
    """--check runs PySCF's DF-MP2 on rank 0 alone; the other ranks waited for it in the last
    gather, so a check longer than DFMP2_DIST_TIMEOUT failed the finished job, and every
    resume failed the same way. Here rank 0's check takes 3 s more against a 2 s timeout."""
    record = tmp_path / "checked.h5"
    job = on_ranks(2, "run", molecule_path("water"), "--basis", "sto-3g", "--backend", "torch",
                   "--threads", "1", "--check", "--json", "-o", record,
                   program=slowed_program(tmp_path, "dfmp2.jobs.run:run_check"),
                   variables={"DFMP2_DIST_TIMEOUT": "2"})
    assert job.code == 0, job.err
    assert json.loads(job.out)["check_passed"] is True
    with h5py.File(record, "r") as h5:
        assert h5.attrs["status"] == "complete" and h5["distributed"].attrs["world_size"] == 2


def test_a_last_point_longer_than_the_timeout_completes_on_ranks(tmp_path):
    """A frequency job's last round leaves a rank with no point (19 points on 2 ranks here):
    it waited in a collective for the other rank's point, and a point longer than
    DFMP2_DIST_TIMEOUT failed every such job at its end, and every resume. Here the last
    point takes 3 s more against a 2 s timeout."""
    record = tmp_path / "freq.h5"
    job = on_ranks(2, "frequencies", molecule_path("water"), "--basis", "sto-3g", "--backend",
                   "torch", "--threads", "1", "--json", "-o", record,
                   program=slowed_program(tmp_path, "dfmp2.vib.hessian:PointEvaluator.evaluate",
                                          "args[1] == 18"),
                   variables={"DFMP2_DIST_TIMEOUT": "2"})
    assert job.code == 0, job.err
    assert len(json.loads(job.out)["frequencies"]) == 3
    with h5py.File(record, "r") as h5:
        assert h5.attrs["status"] == "complete"
        assert len(h5["displacements"]["index"]) == 19


def test_a_block_pair_longer_than_the_timeout_completes_on_ranks(tmp_path):
    """The ranks met after every round of block pairs in a collective: a rank with no pair
    left (or a few rounds ahead) waited there for the others' pair, and one pair longer than
    DFMP2_DIST_TIMEOUT failed the job, and every resume. Here rank 1's first pair takes 3 s
    more against a 2 s timeout."""
    args = (molecule_path("water_dimer"), "--basis", "sto-3g", "--backend", "torch",
            "--threads", "1", "--occ-block", "2", "--json")
    job = on_ranks(2, "run", *args, "-o", tmp_path / "two.h5",
                   program=slowed_program(tmp_path, "dfmp2.mp2.pairs:pair_sums",
                                          "os.environ['SLURM_PROCID'] == '1'"),
                   variables={"DFMP2_DIST_TIMEOUT": "2"})
    assert job.code == 0, job.err
    single = on_ranks(1, "run", *args, "-o", tmp_path / "one.h5")
    assert single.code == 0, single.err
    assert abs(json.loads(job.out)["e_tot"] - json.loads(single.out)["e_tot"]) <= 1e-10
    with h5py.File(tmp_path / "two.h5", "r") as h5:
        assert h5.attrs["status"] == "complete"
        ranks = h5["distributed"].attrs
        assert ranks["world_size"] == 2 and len(json.loads(ranks["rank1.pairs"])) > 1


def test_a_stopped_rank_ends_the_job_within_the_timeout(tmp_path):
    """A rank alive but stopped (SIGSTOP, a frozen node) left the others waiting for its
    block pair for good: they watched for a rank that died, not for one that went silent.
    Here rank 1 stops itself at its first pair, and rank 0 ends within about the 3 s
    timeout."""
    start = time.monotonic()
    job = on_ranks(2, "run", molecule_path("water_dimer"), "--basis", "sto-3g", "--backend",
                   "torch", "--threads", "1", "--occ-block", "2", "-o", tmp_path / "two.h5",
                   program=slowed_program(
                       tmp_path, "dfmp2.mp2.pairs:pair_sums",
                       "os.environ['SLURM_PROCID'] == '1' and os.kill(os.getpid(), 19)", 0),
                   variables={"DFMP2_DIST_TIMEOUT": "3"}, waited=1)
    assert job.code == 1
    assert "rank 1 has not been heard from in 3 s" in job.err
    assert time.monotonic() - start < PROMPT_END_SECONDS + 10
    with h5py.File(tmp_path / "two.h5", "r") as h5:
        assert h5.attrs["status"] == "failed"


def _pairs_done(record) -> int:
    try:
        return len(read_record(record).groups["checkpoint"].datasets.get("pairs", []))
    except (InputError, KeyError):
        return 0


def _children(pid: int) -> list[int]:
    with open(f"/proc/{pid}/task/{pid}/children", encoding="ascii") as handle:
        return [int(p) for p in handle.read().split()]


def _rank_of(pid: int) -> int:
    with open(f"/proc/{pid}/environ", "rb") as handle:
        variables = dict(item.split(b"=", 1) for item in handle.read().split(b"\0") if item)
    return int(variables[b"RANK"])


# A killed rank's job must end well before torchrun's 30 s grace for the survivors (SIGTERM,
# then SIGKILL): a survivor waiting on the dead rank in a collective must handle the SIGTERM.
PROMPT_END_SECONDS = 15


def kill_ranks_when(command: list[str], ready, ranks=(1,), poll: float = 0.02,
                    settle: float = 0.0) -> tuple[str, float]:
    """Start the 2-rank torchrun job ``command``; once ``ready()`` holds (then ``settle``
    seconds more), SIGKILL the workers of ``ranks`` in that order and wait for the job, which
    must fail. Its stderr, and the seconds it took to end after the kill."""
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=environment())
    deadline = time.monotonic() + JOB_TIMEOUT_SECONDS
    while not ready() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(poll)
    assert proc.poll() is None, "the job ended before a rank could be killed"
    time.sleep(settle)
    workers = sorted(_children(proc.pid), key=_rank_of)
    assert len(workers) == 2
    for rank in ranks:
        os.kill(workers[rank], signal.SIGKILL)
    start = time.monotonic()
    _, stderr = proc.communicate(timeout=JOB_TIMEOUT_SECONDS)
    assert proc.returncode != 0
    return stderr, time.monotonic() - start


def test_a_dead_rank_ends_the_job_and_resume_works_with_one_rank(tmp_path):
    record = tmp_path / "benzene.h5"
    args = [molecule_path("benzene"), "--basis", "cc-pvdz", "--backend", "torch",
            "--occ-block", "1", "--threads", "1", "--json", "-o", record]
    stderr, seconds = kill_ranks_when(torchrun(2, *args), lambda: _pairs_done(record) >= 4,
                                      poll=0.05)
    assert seconds < PROMPT_END_SECONDS, "the job did not end promptly"
    killed = read_record(record)
    # Rank 0 either notices the dead rank first (failed) or is stopped by torchrun's SIGTERM
    # to the surviving ranks (interrupted); both leave a resumable record.
    assert killed.attrs["status"] in ("running", "failed", "interrupted")
    if killed.attrs["status"] == "failed":
        assert "distributed run broken" in killed.attrs["error"]
    if killed.attrs["status"] == "interrupted":
        assert "SIGTERM" in killed.attrs["error"]
    assert "Error: distributed run broken" in stderr or "failed" in stderr
    done = _pairs_done(record)
    assert 4 <= done < 21 * 22 // 2
    # The SCF's kernel calls of both ranks (one syrk per rank per build) are in the record
    # saved at the SCF's end: it held rank 0's alone, and the resume carried those only.
    scf_engine = killed.groups["scf_engine"].attrs
    assert scf_engine["calls.syrk.torch-cpu"] == 2 * scf_engine["builds"]

    resumed = run_in_process("run", *args)
    assert resumed.code == 0, resumed.err
    with h5py.File(record, "r") as h5:
        # Every pair's energy call is counted: rank 1's finished pairs, which the killed
        # record's rank-0 ledger did not hold, as calls of no known executor.
        calls = {k: v for k, v in h5["backend"].attrs.items() if k.startswith("calls.mp2_energy")}
        # (A call whose pair the kill kept out of the checkpoint is made again: a few more.)
        assert len(h5["checkpoint/pairs"]) == 21 * 22 // 2 <= sum(calls.values()) <= 21 * 22
    # PySCF's DF-MP2 on the orbitals the killed job's SCF stored and the resumed run reused:
    # the resumed energy is exact. (A fresh SCF is not the reference: two SCFs converged to a
    # 1e-7 orbital gradient give E_corr up to a few 1e-10 Eh apart.)
    assert abs(json.loads(resumed.out)["e_corr"] - stored_orbitals_e_corr(record)) <= 1e-10
    with h5py.File(record, "r") as h5:
        assert h5.attrs["status"] == "complete" and h5.attrs["resumed"]


def test_batch_under_torchrun_spreads_molecules(tmp_path):
    out = tmp_path / "out"
    inputs = [molecule_path(name) for name in ("water", "ammonia", "methane")]
    command = torchrun(2, *inputs, "--basis", "sto-3g", "--backend", "torch", "--threads", "1",
                       "--out", out, command="batch")
    proc = subprocess.run(command, capture_output=True, text=True,
                          timeout=JOB_TIMEOUT_SECONDS, env=environment())
    assert proc.returncode == 0, proc.stderr
    assert (out / "summary-shard-0-of-2.csv").exists()
    assert (out / "summary-shard-1-of-2.csv").exists()
    assert len(list(out.glob("*.h5"))) == 3
    # The two ranks of this node share its default budget (each took all of it).
    from dfmp2.system.memory import memory_budget
    node_budget = memory_budget(None)
    for record in out.glob("*.h5"):
        with h5py.File(record, "r") as h5:
            assert 0.4 * node_budget < h5["input"].attrs["memory_bytes"] < 0.55 * node_budget


def test_a_failed_molecule_on_one_rank_does_not_stop_the_others(tmp_path):
    """Rank 1's only molecule failed at once, the rank exited 1, and torchrun stopped rank 0
    in its first molecule: every rerun ended the same way, so the batch never finished. And
    each rank printed its own JSON array, so stdout was not one JSON document."""
    out = tmp_path / "out"
    inputs = [molecule_path("water"), tmp_path / "missing.xyz", molecule_path("ammonia")]
    command = torchrun(2, *inputs, "--basis", "sto-3g", "--backend", "torch", "--threads", "1",
                       "--out", out, "--json", command="batch")
    proc = subprocess.run(command, capture_output=True, text=True,
                          timeout=JOB_TIMEOUT_SECONDS, env=environment())
    assert proc.returncode == 1, proc.stderr
    rows = json.loads(proc.stdout)
    assert [row["status"] for row in rows] == ["complete", "failed", "complete"]
    assert "1 of 3 molecules failed: missing.xyz" in proc.stderr
    assert [line for line in proc.stderr.splitlines() if line.startswith("Error:")] == [
        line for line in proc.stderr.splitlines() if "1 of 3 molecules failed" in line]


def test_a_batch_with_rank_variables_but_no_other_ranks_fails_in_one_line(tmp_path):
    """RANK, WORLD_SIZE and MASTER_ADDR left in a shell, nobody listening: the batch's ranks
    meet first, so it ends with one error line (torch's C++ retry logs silenced) and runs
    nothing, where it used to run shard 1 of 2 and exit 0."""
    out = tmp_path / "out"
    proc = subprocess.run(
        [python_exe(), "-m", "dfmp2", "batch", str(molecule_path("water")),
         str(molecule_path("methane")), "--basis", "sto-3g", "--out", str(out)],
        capture_output=True, text=True, timeout=JOB_TIMEOUT_SECONDS,
        env={**environment(), "RANK": "1", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1",
             "MASTER_PORT": str(free_port()), "DFMP2_DIST_TIMEOUT": "1"})
    assert proc.returncode == 1
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: cannot join the distributed job")
    assert not out.exists()


def test_two_ranks_resume_with_a_new_block_size(tmp_path):
    """A record interrupted with blocks of one orbital, resumed by two ranks with blocks of
    two: the plan is reconciled with the checkpoint once, on rank 0, before either rank
    starts, so no rank keeps pairs of the old blocks."""
    record = tmp_path / "dimer.h5"
    args = [molecule_path("water_dimer"), "--basis", "cc-pvdz", "--backend", "torch",
            "--threads", "1", "--json"]
    single = run_in_process("run", *args, "--occ-block", "1", "-o", record)
    assert single.code == 0, single.err
    as_interrupted(record, 7)
    resumed = subprocess.run(torchrun(2, *args, "--occ-block", "2", "-o", record),
                             capture_output=True, text=True, timeout=JOB_TIMEOUT_SECONDS,
                             env=environment())
    assert resumed.returncode == 0, resumed.stderr
    line = [entry for entry in resumed.stdout.splitlines() if entry.strip()][0]
    assert abs(json.loads(line)["e_corr"] - json.loads(single.out)["e_corr"]) <= 1e-10
    with h5py.File(record, "r") as h5:
        assert h5.attrs["status"] == "complete" and h5.attrs["resumed"]
        assert h5["checkpoint"].attrs["occ_block"] == 2
        assert len(h5["checkpoint/pairs"]) == 5 * 6 // 2
        # The old blocks' pairs do not count for the new ones: every pair is a rank's.
        group = h5["distributed"].attrs
        assert group["resumed_pairs"] == 0
        assert _ranks_pairs(group) == 5 * 6 // 2


def test_two_ranks_resuming_credit_the_interrupted_runs_pairs_to_it(tmp_path):
    """A resumed record listed only the pairs its ranks computed; those the interrupted run
    had finished were credited to no rank and counted nowhere."""
    record = tmp_path / "dimer.h5"
    args = [molecule_path("water_dimer"), "--basis", "cc-pvdz", "--backend", "torch",
            "--threads", "1", "--json", "--occ-block", "1", "-o", record]
    assert run_in_process("run", *args).code == 0
    as_interrupted(record, 7)
    resumed = subprocess.run(torchrun(2, *args), capture_output=True, text=True,
                             timeout=JOB_TIMEOUT_SECONDS, env=environment())
    assert resumed.returncode == 0, resumed.stderr
    with h5py.File(record, "r") as h5:
        group = h5["distributed"].attrs
        total = len(h5["checkpoint/pairs"])
        assert group["resumed_pairs"] == 7
        assert _ranks_pairs(group) == total - 7


def _ranks_pairs(group) -> int:
    """How many block pairs the ranks of a 2-rank record computed."""
    return sum(len(json.loads(group[f"rank{rank}.pairs"])) for rank in (0, 1))


# Rank 0 waits in a sum that rank 1 never joins, and turns a SIGTERM into an exit at once.
_ABSENT_PEER_SCRIPT = """
import os, signal, sys, time
from pathlib import Path
import numpy as np
from dfmp2.system.distributed import init_world, launch_from

world = init_world(launch_from(os.environ))
if world.rank == 1:
    time.sleep(120)
    sys.exit(0)


def stop(signum, frame):
    print(f"handled after {time.monotonic() - start:.2f} s", flush=True)
    os._exit(0)


signal.signal(signal.SIGTERM, stop)
start = time.monotonic()
Path(sys.argv[1]).touch()
world.allreduce_sum(np.ones(4), "waiting for a rank that never comes")
"""


def test_a_rank_waiting_in_a_collective_handles_sigterm_at_once(tmp_path):
    """torchrun stops the survivors of a dead rank with SIGTERM; a wait inside a collective
    must not hold the handler off until the collective's timeout (60 s here)."""
    waiting = tmp_path / "waiting"
    port = str(free_port())
    ranks = [subprocess.Popen([python_exe(), "-c", _ABSENT_PEER_SCRIPT, str(waiting)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              env={**environment(), "RANK": str(rank), "WORLD_SIZE": "2",
                                   "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port})
             for rank in (0, 1)]
    try:
        deadline = time.monotonic() + JOB_TIMEOUT_SECONDS
        while not waiting.exists() and ranks[0].poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.5)
        ranks[0].send_signal(signal.SIGTERM)
        out, err = ranks[0].communicate(timeout=PROMPT_END_SECONDS)
        assert ranks[0].returncode == 0, err
        assert out.startswith("handled after")
    finally:
        for rank in ranks:
            rank.kill()
            rank.communicate()


def test_a_rank_waiting_to_join_ends_at_once_on_sigterm(tmp_path):
    """A rank whose peers are gone waits in torch's C++ rendezvous, where Python's handlers do
    not run: torchrun's SIGTERM waited for the join's timeout (58 s with a 40 s timeout), then
    the rank said the finished work was in a record it had not begun."""
    launch = {"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1", "MASTER_ADDR": "127.0.0.1",
              "MASTER_PORT": str(free_port()), "DFMP2_DIST_TIMEOUT": "60"}
    proc = subprocess.Popen([python_exe(), "-m", "dfmp2", "-vv", "run", molecule_path("water"),
                             "--basis", "sto-3g", "--threads", "1", "-o", tmp_path / "w.h5"],
                            stderr=subprocess.PIPE, text=True,
                            env={**environment(), **launch})
    for line in proc.stderr:
        if "joining the process group" in line:
            break
    time.sleep(1.0)
    assert proc.poll() is None, "the rank is waiting to join"
    proc.send_signal(signal.SIGTERM)
    start = time.monotonic()
    proc.wait(timeout=JOB_TIMEOUT_SECONDS)
    assert time.monotonic() - start < 5
    assert proc.returncode == -signal.SIGTERM
    assert not (tmp_path / "w.h5").exists()


def test_a_rank_whose_rank_0_is_gone_ends_within_the_timeout(tmp_path):
    """Joining waits in steps (connecting to rank 0's store, which torch retries, gloo's
    connections, the first gather), each with the whole DFMP2_DIST_TIMEOUT: a rank whose
    rank 0 was killed while starting waited 2.5 times the timeout. The join now has one
    deadline, and ends with one error line."""
    launch = {"SLURM_PROCID": "1", "SLURM_STEP_NUM_TASKS": "2", "MASTER_ADDR": "127.0.0.1",
              "MASTER_PORT": str(free_port()), "DFMP2_DIST_TIMEOUT": "4"}
    proc = subprocess.Popen([python_exe(), "-m", "dfmp2", "-vv", "run", molecule_path("water"),
                             "--basis", "sto-3g", "--threads", "1", "-o", tmp_path / "w.h5"],
                            stderr=subprocess.PIPE, text=True, env={**environment(), **launch})
    for line in proc.stderr:
        if "joining the process group" in line:
            break
    start = time.monotonic()
    rest = proc.communicate(timeout=JOB_TIMEOUT_SECONDS)[1]
    # Within the deadline and the exit, well short of the 2.1 to 2.5 deadlines of old.
    assert time.monotonic() - start < 4 + 3
    assert proc.returncode == 1
    errors = [line for line in rest.splitlines() if line.startswith("Error:")]
    assert len(errors) == 1 and errors[0].startswith("Error: cannot join the distributed job")
    assert not (tmp_path / "w.h5").exists()


class _NeverDone:
    """A collective's work handle whose peer never answers."""

    def is_completed(self) -> bool:
        return False

    def wait(self) -> None:
        raise RuntimeError("timed out")


class _DoneAfter:
    def __init__(self, seconds: float) -> None:
        self.end = time.monotonic() + seconds

    def is_completed(self) -> bool:
        return time.monotonic() >= self.end

    def wait(self) -> None:
        pass


def test_a_wait_ends_when_a_peer_on_the_host_has_ended():
    """Gloo does not always notice a dead peer of an all-to-all, and srun sends the survivors
    no SIGTERM: they waited the whole DFMP2_DIST_TIMEOUT (300 s). A wait now looks at its
    peers' processes every second: an ended one (reaped, or a zombie) ends it with one
    message; live ones never do."""
    reaped = subprocess.Popen(["sleep", "0.2"])
    zombie = subprocess.Popen(["sleep", "0.2"])
    started = {proc.pid: process_state(proc.pid)[1] for proc in (reaped, zombie)}
    reaped.wait()
    time.sleep(0.5)
    try:
        for pid in (reaped.pid, zombie.pid):
            start = time.monotonic()
            with pytest.raises(RunFailure, match=f"while sharing: rank 1 .process {pid}. "
                                                 "has ended"):
                _wait(_NeverDone(), "sharing", 60, PeerWatch({1: (pid, started[pid])}))
            assert time.monotonic() - start < 5
    finally:
        zombie.wait()
    live = {rank: (pid, process_state(pid)[1])
            for rank, pid in ((1, os.getpid()), (2, os.getppid()))}
    start = time.monotonic()
    _wait(_DoneAfter(2.5), "sharing", 60, PeerWatch(live))
    assert 2.5 <= time.monotonic() - start < 5
    # A process of that number but another start (the number reused) is not the peer.
    with pytest.raises(RunFailure, match="has ended"):
        _wait(_NeverDone(), "sharing", 60, PeerWatch({1: (os.getpid(), "0")}))


def _two_tasks(folder: Path, per_rank_args: list[list]) -> list[subprocess.CompletedProcess]:
    """Two srun-style tasks, each with its own arguments."""
    port = str(free_port())
    procs = [subprocess.Popen([python_exe(), "-m", "dfmp2", *map(str, args)], cwd=folder,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              env={**environment(), "SLURM_PROCID": str(rank),
                                   "SLURM_STEP_NUM_TASKS": "2", "MASTER_ADDR": "127.0.0.1",
                                   "MASTER_PORT": port})
             for rank, args in enumerate(per_rank_args)]
    done = []
    for proc in procs:
        out, err = proc.communicate(timeout=JOB_TIMEOUT_SECONDS)
        done.append(subprocess.CompletedProcess(proc.args, proc.returncode, out, err))
    return done


def test_ranks_agree_on_the_budget_and_refuse_other_calculations(tmp_path):
    """Each rank measured its own default budget, and the gradient's blocks follow from it:
    ranks of other budgets (or given another copy of the molecule) ended in tracebacks of
    collectives that no longer matched. The ranks now take the smallest budget, and refuse
    to run different calculations with one line."""
    args = ["gradient", molecule_path("water_dimer"), "--basis", "cc-pvdz", "--threads", "1",
            "--json", "-o", tmp_path / "g.h5"]
    single = run_in_process(*args[:-1], tmp_path / "one.h5")
    assert single.code == 0, single.err
    ranks = _two_tasks(tmp_path, [[*args, "--memory", "2GB"], [*args, "--memory", "3MB"]])
    assert [r.returncode for r in ranks] == [0, 0], ranks[1].stderr
    gradients = [np.array(json.loads(text)["gradient"]) for text in (single.out, ranks[0].stdout)]
    assert np.abs(gradients[0] - gradients[1]).max() <= 1e-8
    with h5py.File(tmp_path / "g.h5", "r") as h5:
        assert h5["gradient"].attrs["tensors"] == "scratch"
    moved = tmp_path / "moved.xyz"
    moved.write_text(molecule_path("water_dimer").read_text().replace("0.000000", "0.000100", 1))
    other = _two_tasks(tmp_path, [[*args[:1], molecule_path("water_dimer"), *args[2:-1],
                                   tmp_path / "x.h5"],
                                  [*args[:1], moved, *args[2:-1], tmp_path / "x.h5"]])
    for result in other:
        assert result.returncode == 2 and "Traceback" not in result.stderr
        errors = [line for line in result.stderr.splitlines() if line.startswith("Error:")]
        assert errors == ["Error: rank 1 was given another calculation than rank 0 (its "
                          "molecule or options differ); start every rank with the same "
                          "command and the same files"]
    assert not (tmp_path / "x.h5").exists()


def test_a_default_budget_is_shared_by_the_ranks_of_a_node(tmp_path):
    """Each rank took 60% of the node's free memory as its own default budget: two ranks on
    one node planned 120% of it (32 on a trn1 node, 1920%). The ranks of a node now share
    it; a --memory stays each rank's own."""
    from dfmp2.system.memory import memory_budget

    args = ["run", molecule_path("water"), "--basis", "sto-3g", "--threads", "1", "--json"]
    node_budget = memory_budget(None)
    ranks = _two_tasks(tmp_path, [[*args, "-o", tmp_path / "d.h5"]] * 2)
    assert [r.returncode for r in ranks] == [0, 0], ranks[1].stderr
    with h5py.File(tmp_path / "d.h5", "r") as h5:
        shared = h5["input"].attrs["memory_bytes"]
    # Free memory moves a little while the ranks start.
    assert 0.4 * node_budget < shared < 0.55 * node_budget
    ranks = _two_tasks(tmp_path, [[*args, "--memory", "1GB", "-o", tmp_path / "m.h5"]] * 2)
    assert [r.returncode for r in ranks] == [0, 0], ranks[1].stderr
    with h5py.File(tmp_path / "m.h5", "r") as h5:
        assert h5["input"].attrs["memory_bytes"] == 10**9


def test_ranks_given_one_molecule_by_two_paths_agree(tmp_path, monkeypatch):
    """A relative and an absolute path to one file were refused as another calculation: the
    molecule is compared as read, not by the path that named it."""
    from dfmp2.input.settings import RunSettings
    from dfmp2.input.xyz import read_xyz
    from dfmp2.jobs.preamble import _calculation_fingerprint
    monkeypatch.chdir(tmp_path)
    (tmp_path / "w.xyz").write_text(molecule_path("water").read_text())
    fingerprints = {_calculation_fingerprint(RunSettings(molecule=path, output=output),
                                             read_xyz(path))
                    for path, output in ((Path("w.xyz"), Path("w.h5")),
                                         (tmp_path / "w.xyz", tmp_path / "w.h5"))}
    assert len(fingerprints) == 1


def test_an_input_error_under_torchrun_is_one_line(tmp_path):
    """Every rank read the same arguments and printed the same error, and the rank that
    torchrun stopped then added "SIGTERM while starting": a later rank of a node now leaves
    input errors and interruptions to the node's first rank."""
    for args in ((tmp_path / "missing.xyz",),
                 (molecule_path("water"), "--basis", "no-such-basis")):
        proc = subprocess.run(torchrun(2, *args), capture_output=True, text=True,
                              timeout=JOB_TIMEOUT_SECONDS, env=environment())
        assert proc.returncode != 0
        errors = [line for line in proc.stderr.splitlines() if line.startswith("Error:")]
        assert len(errors) == 1, proc.stderr
        assert "missing.xyz" in errors[0] or "no-such-basis" in errors[0]


TORCHRUN_PAIR = {"RANK": "1", "WORLD_SIZE": "2"}
SRUN_TASKS = {"SLURM_PROCID": "3", "SLURM_STEP_NUM_TASKS": "4"}


@pytest.mark.parametrize("variables, code, printed", [
    ({"LOCAL_RANK": "1", **TORCHRUN_PAIR}, 2, True),
    ({"SLURM_LOCALID": "3", **SRUN_TASKS}, 143, False),
    ({"SLURM_LOCALID": "1", "SLURM_NTASKS": "2"}, 2, True),
    ({"LOCAL_RANK": "1", **TORCHRUN_PAIR}, 1, True),
    ({"LOCAL_RANK": "0", "SLURM_LOCALID": "0", **TORCHRUN_PAIR, **SRUN_TASKS}, 143, True),
    ({"LOCAL_RANK": "x", **TORCHRUN_PAIR}, 130, True), ({}, 2, True),
    # Left over in a shell, with no launch of several processes around them.
    ({"LOCAL_RANK": "1"}, 2, True), ({"SLURM_LOCALID": "3"}, 143, True),
    ({"LOCAL_RANK": "1", "WORLD_SIZE": "1"}, 143, True),
    # A size without a rank: dfmp2 runs one process (no launch), which must say so.
    ({"LOCAL_RANK": "1", "WORLD_SIZE": "2"}, 143, True),
    ({"LOCAL_RANK": "1", "WORLD_SIZE": "2"}, 2, True),
    ({"SLURM_LOCALID": "3", "SLURM_STEP_NUM_TASKS": "4"}, 143, True)])
def test_a_later_rank_of_a_node_leaves_the_shared_errors_to_the_first(
        variables, code, printed, monkeypatch, capsys):
    """An interruption reaches every rank: a later one exits without a line. A later
    torchrun rank prints its own input error after the grace in which the first rank would
    have ended the job (here nobody does, and the grace is cut to 0.5 s); srun's ranks, and
    every rank's own failure, print at once."""
    from dfmp2 import cli

    monkeypatch.setattr(cli, "FIRST_RANK_GRACE_SECONDS", 0.5)
    for name in ("LOCAL_RANK", "SLURM_LOCALID", "WORLD_SIZE", "SLURM_STEP_NUM_TASKS",
                 "SLURM_NTASKS", "RANK", "SLURM_PROCID"):
        monkeypatch.delenv(name, raising=False)
    for name, value in variables.items():
        monkeypatch.setenv(name, value)
    started = time.monotonic()
    with pytest.raises(SystemExit) as stopped:
        cli._fail("the same on every rank", code)
    waited = time.monotonic() - started
    assert stopped.value.code == code
    assert ("Error: the same on every rank" in capsys.readouterr().err) == printed
    assert (waited >= 0.5) == (variables.get("LOCAL_RANK") == "1" and code == 2
                               and variables.get("WORLD_SIZE") == "2" and "RANK" in variables)


def test_a_later_rank_stopped_during_its_grace_exits_without_a_line(monkeypatch):
    """The first rank failed alike and the launcher stops the later one while it waits: it
    ends by the signal, quietly."""
    from dfmp2 import cli

    monkeypatch.setattr(cli, "FIRST_RANK_GRACE_SECONDS", 30.0)
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    timer = threading.Timer(1.0, os.kill, (os.getpid(), signal.SIGTERM))
    timer.start()
    started = time.monotonic()
    try:
        result = run_in_process("run", molecule_path("water"), "--basis", "no-such-basis")
    finally:
        timer.cancel()
    assert result.code == 128 + signal.SIGTERM and time.monotonic() - started < 20
    assert "Error:" not in result.err


def launches_of(group, kernel: str) -> int:
    """The launches of every signature of ``kernel`` in a record's ``/backend`` or
    ``/scf_engine``."""
    launches = json.loads(group.attrs["launches"])
    return sum(n for signature, n in launches.items() if signature.startswith(f"{kernel}("))


@pytest.mark.parametrize("command", ["run", "frequencies"])
def test_nki_launches_and_estimate_count_every_rank(tmp_path, command):
    """On NKI the record's launches, signatures and estimated trn1 time were rank 0's alone,
    beside call counts summed over every rank (water / STO-3G on two ranks: 8 of the 15
    energy pairs' launches, half the SCF's syrk launches). With one occupied orbital per
    block the ranks compute the single process's energy pairs (a frequency job its points,
    each whole on one rank), so their launches add up to that process's; each SCF's launches
    match its calls."""
    molecule = molecule_path("water" if command == "run" else "hydrogen_fluoride")
    args = [molecule, "--basis", "sto-3g", "--backend", "nki", "--occ-block", "1",
            "--threads", "1", "--json"]
    single = run_in_process(command, *args, "-o", tmp_path / "one.h5")
    assert single.code == 0, single.err
    double = on_ranks(2, command, *args, "-o", tmp_path / "two.h5")
    assert double.code == 0, double.err
    with h5py.File(tmp_path / "one.h5", "r") as one, h5py.File(tmp_path / "two.h5", "r") as two:
        assert two["backend"].attrs["nki_mode"] == "interpreter"
        for kernel in ("gemm", "syrk"):
            calls = f"calls.{kernel}.nki-interpreter"
            # These SCFs launch each J/K product once; the ranks each build their part.
            assert launches_of(one["scf_engine"], kernel) == one["scf_engine"].attrs[calls]
            assert launches_of(two["scf_engine"], kernel) == two["scf_engine"].attrs[calls]
        if command == "run":
            energy = ("mp2_energy", "mp2_energy_fused", "mp2_energy_os", "mp2_energy_os_fused")
            assert (sum(launches_of(two["backend"], k) for k in energy)
                    == sum(launches_of(one["backend"], k) for k in energy) > 0)
            return
        # (Each rank converges its own SCF at the reference geometry first: the SCFs' launches
        # differ, and are checked against their calls above.)
        backend = one["backend"].attrs, two["backend"].attrs
        assert json.loads(backend[1]["launches"]) == json.loads(backend[0]["launches"])
        assert backend[1]["matmul_flops"] == backend[0]["matmul_flops"] > 0
        estimates = [json.loads(attrs["estimate"]) for attrs in backend]
        assert {k: pytest.approx(v, rel=1e-12) if isinstance(v, float) else v
                for k, v in estimates[0].items()} == estimates[1]
