"""B built by every rank (gloo, 2 and 3 CPU ranks under torchrun): each rank transforms its
share of the auxiliary shells and fits its share of the column chunks of the shared scratch
file. The fitted tensor and the energies equal the single process's; a build killed halfway is
rebuilt by the resumed run, whatever its number of ranks.

Run as a script under torchrun (``python -m torch.distributed.run ... test_distributed_b.py
OUT``), this file builds B on every rank and leaves each rank's timings and rank 0's B in OUT.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from unittest import mock

import h5py
import numpy as np
import pytest
import scipy.linalg

import kernels
from conftest import molecule_path, pyscf_molecule, stored_orbitals_e_corr
from dfmp2.df import store as b_store
from dfmp2.df.auxbasis import ri_basis
from dfmp2.df.fitted import build_fitted_tensors, column_share
from dfmp2.df.store import ScratchArea
from dfmp2.mp2.kernel import FitBasis, fit_basis
from dfmp2.records.tree import read_record
from dfmp2.system.distributed import init_world, launch_from
from test_distributed import (environment, JOB_TIMEOUT_SECONDS, kill_ranks_when, on_ranks,
                              rank_reports, torchrun)

# About 40 auxiliary functions per integral block: several blocks in every rank's share.
SMALL_BLOCK_BYTES = 40 * 8 * (48 * 49 // 2 + 48 * 48 + 48 * 5 + 5 * 30)
# Column chunks of 16 columns (168 auxiliary functions): several chunks in every rank's share.
SMALL_CHUNK_BYTES = 16 * 8 * 168
# (channel sizes (nocc, nvir), metric kind) of each B the script builds.
CASES = {"rhf": ([(5, 30)], "cholesky"), "uhf": ([(5, 30), (4, 31)], "cholesky"),
         "eigen": ([(5, 30)], "eigen")}


def problem(kind: str) -> tuple:
    """Water dimer (cc-pVDZ, 48 functions) with its RI basis (168 functions), the metric of
    ``kind`` (the eigen factor when the Cholesky factorisation is made to fail) and made-up
    orbitals: B needs only coefficients, the same on every rank."""
    mol = pyscf_molecule("water_dimer", "cc-pvdz")
    sizes, metric_kind = CASES[kind]
    if metric_kind == "eigen":
        with mock.patch("scipy.linalg.cholesky", side_effect=scipy.linalg.LinAlgError):
            fit = fit_basis(mol, ri_basis(mol, None))
    else:
        fit = fit_basis(mol, ri_basis(mol, None))
    assert fit.metric.kind == metric_kind and fit.naux == 168
    rng = np.random.default_rng(11)
    orbitals = [(0.2 * rng.standard_normal((48, nocc)), 0.2 * rng.standard_normal((48, nvir)))
                for nocc, nvir in sizes]
    return mol, fit, orbitals


def build(mol, fit: FitBasis, orbitals: list, scratch: ScratchArea | None, timings: dict,
          world=None) -> list:
    return build_fitted_tensors(mol, fit.auxmol, orbitals, fit.metric,
                                kernels.load("torch", "fp64"), SMALL_BLOCK_BYTES, scratch,
                                timings, world)


def build_on_every_rank(out: Path) -> None:
    """The script: every case built by all ranks into ``out``; each rank writes its timings
    and column shares, rank 0 the fitted tensors (read before they are deleted)."""
    b_store.SCRATCH_CHUNK_BYTES = SMALL_CHUNK_BYTES
    world = init_world(launch_from(os.environ))
    report = {}
    try:
        for kind in CASES:
            mol, fit, orbitals = problem(kind)
            timings: dict[str, float] = {}
            stores = build(mol, fit, orbitals, ScratchArea(out, kind), timings, world)
            if world.is_root:
                for n, store in enumerate(stores):
                    np.save(out / f"{kind}.b{n}.npy", store.read_columns(0, store.ncols).numpy())
            report[kind] = {"timings": timings,
                            "columns": [column_share(store, world) for store in stores]}
            world.barrier("reading B")
            for store in stores:
                store.close()
        (out / f"rank{world.rank}.json").write_text(json.dumps(report))
    finally:
        world.close()


def test_every_rank_builds_its_share_of_b(tmp_path):
    # Three ranks: shares of unequal size (two ranks run it in the command-line tests).
    nranks = 3
    reports = rank_reports(__file__, tmp_path, nranks)
    for kind, (sizes, _) in CASES.items():
        mol, fit, orbitals = problem(kind)
        single = build(mol, fit, orbitals, None, {})
        for n, ((nocc, nvir), reference) in enumerate(zip(sizes, single)):
            shared = np.load(tmp_path / f"{kind}.b{n}.npy")
            assert np.max(np.abs(shared - reference.data.numpy())) <= 1e-12
            # Every rank fitted columns of its own, and together all columns once.
            shares = [report[kind]["columns"][n] for report in reports]
            assert all(c1 > c0 for c0, c1 in shares)
            assert shares[0][0] == 0 and shares[-1][1] == nocc * nvir
            assert all(shares[r][1] == shares[r + 1][0] for r in range(nranks - 1))
        for report in reports:
            timings = report[kind]["timings"]
            assert timings["integrals"] > 0 and timings["transform"] > 0 and timings["fit"] > 0
    assert not list(tmp_path.glob(".*.bin")), "rank 0 removes the shared files"


def cli_args(molecule: str) -> list:
    return [molecule_path(molecule), "--basis", "cc-pvdz", "--backend", "torch", "--threads",
            "1", "--json"]


# Closed shell on three ranks, open shell on two: the deal of B's columns and pairs is uneven
# on three (2 ranks are the in-core and killed-build tests' case). The shared B file is in a
# --scratch folder, named by rank 0 for all.
@pytest.mark.parametrize("molecule,nranks", [("water_dimer", 3), ("hydroxyl", 2)])
def test_energies_on_several_ranks_match_pyscf_on_their_orbitals(tmp_path, molecule, nranks):
    record, scratch = tmp_path / "shared.h5", tmp_path / "scratch"
    scratch.mkdir()
    job = subprocess.run(torchrun(nranks, *cli_args(molecule), "--scratch", scratch, "-o",
                                  record),
                         capture_output=True, text=True, timeout=JOB_TIMEOUT_SECONDS,
                         env=environment())
    assert job.returncode == 0, job.stderr
    # The ranks' SCF is checked against one process's in test_distributed_scf; here B and the
    # energy: PySCF's DF-MP2 on the orbitals that SCF stored.
    spin = 1 if molecule == "hydroxyl" else 0
    reference = stored_orbitals_e_corr(record, molecule, spin)
    assert abs(json.loads(job.stdout)["e_corr"] - reference) <= 1e-10
    with h5py.File(record, "r") as h5:
        assert h5["plan"].attrs["out_of_core"]
        assert h5["distributed"].attrs["world_size"] == nranks
        assert h5["timings"].attrs["integrals"] > 0 and h5["timings"].attrs["fit"] > 0
    assert not list(tmp_path.glob(".shared.h5.*")) and not list(scratch.iterdir())


def _children(pid: int) -> list[int]:
    with open(f"/proc/{pid}/task/{pid}/children", encoding="ascii") as handle:
        return [int(p) for p in handle.read().split()]


def _signature(path: Path) -> str | None:
    """The orbital signature in a scratch file's header (None when it has none yet: a file
    killed so early that even its header is unwritten has none either)."""
    with open(path, "rb") as handle:
        text = handle.read(b_store.HEADER_BYTES).rstrip(b" \0")
    return json.loads(text).get(b_store.SIGNATURE) if text else None


@pytest.mark.parametrize("killed,resume_ranks", [("one", 1), ("every", 3)])
def test_a_build_killed_halfway_is_rebuilt_on_resume(tmp_path, killed, resume_ranks):
    """Two ranks building B; as soon as its scratch file appears (the SCF is done), rank 1 is
    killed (the job then ends, rank 0 removing the file) or every rank is (the unfinished
    file stays). The resumed run, on another number of ranks, rebuilds B."""
    record = tmp_path / "benzene.h5"
    args = [molecule_path("benzene"), "--basis", "cc-pvdz", "--backend", "torch", "--threads",
            "1", "--json", "-o", record]
    scratch = tmp_path / ".benzene.h5.run.b0.bin"
    # Rank 0 first when every rank goes: it would remove the file on noticing rank 1's death.
    kill_ranks_when(torchrun(2, *args), scratch.exists, (0, 1) if killed == "every" else (1,),
                    poll=0.002)
    killed_record = read_record(record)
    assert killed_record.attrs["status"] != "complete"
    checkpoint = killed_record.groups.get("checkpoint")
    assert checkpoint is None or len(checkpoint.datasets.get("pairs", [])) == 0
    if killed == "every":
        assert _signature(scratch) is None, "killed before B was finished"

    resumed = on_ranks(resume_ranks, "run", *args)
    assert resumed.code == 0, resumed.err
    # The single-process energy on the orbitals the killed job's SCF stored (the resumed run
    # reuses them): PySCF's DF-MP2 on them.
    with h5py.File(record, "r") as h5:
        assert h5.attrs["status"] == "complete" and h5.attrs["resumed"]
    line = [entry for entry in resumed.out.splitlines() if entry.strip()][0]
    assert abs(json.loads(line)["e_corr"] - stored_orbitals_e_corr(record)) <= 1e-10
    assert not list(tmp_path.glob(".benzene.h5.*.bin"))


if __name__ == "__main__":
    build_on_every_rank(Path(sys.argv[1]))
