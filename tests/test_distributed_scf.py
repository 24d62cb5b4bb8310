"""The SCF on every rank (gloo, CPU): each rank builds its slice of the JK-fit tensor and its
share of every J/K build, so 2 and 3 ranks give the single process's SCF (same cycles, one
more or fewer for UHF, same energies to 1e-9 Eh) for RHF, UHF with its stability check, a
double hybrid, and a tensor out of core; a rank that dies during the SCF ends the job
quickly, and its record is then rerun by one process.

Run as a script under torchrun (``python -m torch.distributed.run ... test_distributed_scf.py
OUT``), this file builds the JK-fit tensor on every rank (Cholesky and eigen metric, slices in
memory and in each rank's file, pieces exchanged over several rounds) and leaves the summed J
and K and each rank's slice in OUT.
"""
from __future__ import annotations

import contextlib
import json
import os
import sys
from pathlib import Path
from unittest import mock

import h5py
import numpy as np
import pytest
import scipy.linalg
from pyscf import df

import kernels
from conftest import molecule_path, pyscf_df_rhf, pyscf_molecule, stored_orbitals_e_corr
from dfmp2.df.store import ScratchArea
from dfmp2.records.tree import read_record
from dfmp2.scf.jk import JkEngine, factorize
from dfmp2.scf import jk_tensor_build
from dfmp2.system.distributed import init_world, launch_from
from test_distributed import (PROMPT_END_SECONDS, kill_ranks_when, on_ranks, rank_reports,
                              torchrun)

JOB_TIMEOUT_SECONDS = 240
TOLERANCE = 1e-9
COMMON = ("--backend", "torch", "--threads", "1", "--json")
# Units of a few AO rows, so that the ranks exchange over several rounds (the water dimer
# has 48 AOs and 280 fit functions).
SMALL_UNIT_BYTES = 4 * 48 * 280 * 8
# Budgets that keep every rank's slice in memory, and none.
BUDGETS = {"memory": 10**9, "file": 10**6}


def jk_problem():
    """Water dimer (cc-pVDZ) with its JK-fit basis, and a fixed density with its factors."""
    mol = pyscf_molecule("water_dimer", "cc-pvdz")
    auxmol = df.addons.make_auxmol(mol, df.make_auxbasis(mol))
    root = np.random.default_rng(5).standard_normal((mol.nao_nr(), 10))
    dm = 0.1 * root @ root.T
    return mol, auxmol, dm, factorize(dm, 1)


def metric_as(kind: str):
    """The metric of ``kind``: an eigen one by making its Cholesky factorisation fail."""
    return (mock.patch("scipy.linalg.cholesky", side_effect=scipy.linalg.LinAlgError)
            if kind == "eigen" else contextlib.nullcontext())


def build_jk_on_every_rank(out: Path) -> None:
    """The script: each case built by all ranks; rank 0 writes the summed J and K, each rank
    its slices and where it keeps them."""
    jk_tensor_build.UNIT_BYTES = SMALL_UNIT_BYTES
    world = init_world(launch_from(os.environ))
    fp64 = kernels.load("torch", "fp64")
    report = {}
    try:
        for kind in ("cholesky", "eigen"):
            mol, auxmol, dm, factors = jk_problem()
            for where, budget in BUDGETS.items():
                with metric_as(kind):
                    tensor = jk_tensor_build.build_jk_tensor(
                        mol, auxmol, fp64, budget, ScratchArea(out, f"{kind}.{where}"), world)
                vj, vk = JkEngine(tensor, fp64).build(dm[None], [factors])
                total = world.allreduce_sum(np.stack([vj[0], vk[0]]), "adding up J/K")
                if world.is_root:
                    np.save(out / f"{kind}.{where}.npy", total)
                report[f"{kind}.{where}"] = {
                    "metric": tensor.metric.kind, "location": tensor.store.location,
                    "columns": [tensor.columns.start, tensor.columns.stop],
                    "naux": tensor.naux}
                world.barrier("reading the tensor")
                tensor.close()
        (out / f"rank{world.rank}.json").write_text(json.dumps(report))
    finally:
        world.close()


def test_every_rank_builds_its_slice_of_the_jk_tensor(tmp_path):
    # Three ranks: slices and units dealt unevenly (two ranks run it in the command-line tests).
    nranks = 3
    reports = rank_reports(__file__, tmp_path, nranks)
    fp64 = kernels.load("torch", "fp64")
    for kind in ("cholesky", "eigen"):
        mol, auxmol, dm, factors = jk_problem()
        with metric_as(kind), mock.patch.object(jk_tensor_build, "UNIT_BYTES",
                                                SMALL_UNIT_BYTES):
            single = jk_tensor_build.build_jk_tensor(mol, auxmol, fp64, 10**9, None)
        vj, vk = JkEngine(single, fp64).build(dm[None], [factors])
        for where in BUDGETS:
            summed = np.load(tmp_path / f"{kind}.{where}.npy")
            assert np.abs(summed[0] - vj[0]).max() <= 1e-11
            assert np.abs(summed[1] - vk[0]).max() <= 1e-11
            cases = [report[f"{kind}.{where}"] for report in reports]
            assert all(case["metric"] == kind for case in cases)
            expected = "memory" if where == "memory" else "scratch"
            assert all(case["location"] == expected for case in cases)
            # Every rank holds fit functions of its own, and together all of them once.
            shares = [case["columns"] for case in cases]
            assert all(c1 > c0 for c0, c1 in shares)
            assert shares[0][0] == 0 and shares[-1][1] == single.naux
            assert all(shares[r][1] == shares[r + 1][0] for r in range(nranks - 1))
    assert not list(tmp_path.glob(".*.bin")), "every rank removes its file"


def run_job(record, molecule: str, *options: str, ranks: int = 1) -> dict:
    """``dfmp2 run`` on ``ranks`` ranks under torchrun, or in this process for one."""
    job = on_ranks(ranks, "run", molecule_path(molecule), *options, *COMMON, "-o", record)
    assert job.code == 0, job.err
    lines = [line for line in job.out.splitlines() if line.strip()]
    assert len(lines) == 1, "only rank 0 prints"
    return json.loads(lines[0])


def scf_facts(record) -> tuple[int, int, bool]:
    """(SCF cycles, J/K builds, tensor out of core) from a record."""
    with h5py.File(record, "r") as h5:
        engine = h5["scf_engine"].attrs
        return int(h5["scf"].attrs["cycles"]), int(engine["builds"]), bool(engine["out_of_core"])


def assert_same_energies(ours: dict, single: dict, *names: str) -> None:
    for name in ("e_scf", "e_corr", *names):
        assert abs(ours[name] - single[name]) <= TOLERANCE, name


@pytest.fixture(scope="module")
def dimer_single(tmp_path_factory):
    record = tmp_path_factory.mktemp("single") / "one.h5"
    return run_job(record, "water_dimer", "--basis", "cc-pvdz"), scf_facts(record)


def test_rhf_on_three_ranks_is_the_single_process_scf(tmp_path, dimer_single):
    # (Two ranks: the out-of-core test below, on the same molecule and with the same checks.)
    single, single_facts = dimer_single
    record = tmp_path / "dimer.h5"
    ours = run_job(record, "water_dimer", "--basis", "cc-pvdz", ranks=3)
    assert_same_energies(ours, single)
    assert scf_facts(record) == single_facts
    with h5py.File(record, "r") as h5:
        assert {"scf", "jk_tensor"} <= set(h5["timings"].attrs)
    assert not list(tmp_path.glob(".dimer.h5.*")), "the shared tensor files are removed"


def test_jk_tensor_out_of_core_on_two_ranks(tmp_path, dimer_single):
    """1.4 MB keeps not even half of the 2.2 MB tensor in memory: each rank reads its slice
    from the shared file in every build."""
    single, (cycles, builds, out_of_core) = dimer_single
    assert not out_of_core
    record = tmp_path / "dimer.h5"
    ours = run_job(record, "water_dimer", "--basis", "cc-pvdz", "--memory", "1400KB", ranks=2)
    assert_same_energies(ours, single)
    assert scf_facts(record) == (cycles, builds, True)
    assert not list(tmp_path.glob(".dimer.h5.*"))


def test_uhf_and_its_stability_check_on_two_ranks(tmp_path):
    single = run_job(tmp_path / "one.h5", "hydroxyl", "--basis", "cc-pvdz")
    ours = run_job(tmp_path / "two.h5", "hydroxyl", "--basis", "cc-pvdz", ranks=2)
    assert_same_energies(ours, single)
    assert ours["stability"] == single["stability"] == "stable"
    assert abs(ours["stability_eigenvalue"] - single["stability_eigenvalue"]) <= 1e-6
    # Each rank's fp32 builds sum its own slice of the fit functions, so the fp32 steps round
    # differently from one process's; with PySCF's DIIS space of 8 for open shells, hydroxyl's
    # fp64 tail then takes 14 cycles on two ranks and 15 in one process, to the same energy.
    (cycles, builds, out_of_core), (cycles_one, builds_one, out_of_core_one) = (
        scf_facts(tmp_path / "two.h5"), scf_facts(tmp_path / "one.h5"))
    assert abs(cycles - cycles_one) <= 1 and abs(builds - builds_one) <= 1
    assert out_of_core == out_of_core_one


def test_a_rank_killed_during_the_scf_ends_the_job_and_one_process_reruns_it(tmp_path):
    record = tmp_path / "benzene.h5"
    options = ("--basis", "cc-pvdz")
    # A budget too small for the tensor's slices in memory: each rank's slice goes to its own
    # file, which appears when the SCF starts building the tensor.
    slice_file = tmp_path / ".benzene.h5.run.jk.slice1.bin"
    stderr, seconds = kill_ranks_when(
        torchrun(2, molecule_path("benzene"), *options, "--memory", "20MB", *COMMON, "-o",
                 record), slice_file.exists, poll=0.01, settle=0.3)
    # torchrun stops the survivor at once (SIGTERM), also while it waits in a collective with
    # the dead rank (before, such a wait held off the handler until the 30 s SIGKILL).
    assert seconds < PROMPT_END_SECONDS, "the job did not end promptly"
    killed = read_record(record)
    assert "scf" not in killed.groups, "the rank was killed during the SCF"
    assert killed.attrs["status"] in ("running", "failed", "interrupted")
    if killed.attrs["status"] == "failed":
        assert "distributed run broken" in killed.attrs["error"]
    assert "Error: distributed run broken" in stderr or "failed" in stderr

    # Nothing was stored before the SCF finished, so the rerun on the record, by one process,
    # starts afresh: a whole SCF, PySCF's DF-RHF energy, and PySCF's DF-MP2 on the orbitals
    # it stored. (Killed B builds are resumed on one rank and on three in
    # test_distributed_b.)
    rerun = run_job(record, "benzene", *options)
    assert abs(rerun["e_scf"] - pyscf_df_rhf(pyscf_molecule("benzene", "cc-pvdz")).e_tot) <= 1e-10
    assert abs(rerun["e_corr"] - stored_orbitals_e_corr(record)) <= 1e-10
    with h5py.File(record, "r") as h5:
        assert h5.attrs["status"] == "complete" and not h5.attrs["resumed"]
        assert h5["scf"].attrs["converged"] and h5["scf"].attrs["cycles"] > 5
    assert not list(tmp_path.glob(".benzene.h5.*"))


if __name__ == "__main__":
    build_jk_on_every_rank(Path(sys.argv[1]))
