"""Shared helpers: molecules from the bundled XYZ files and PySCF references built in the test."""
from __future__ import annotations

import contextlib
import io
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

# A pytest-xdist worker shares the cores with another worker: one thread for it and for the
# runs it starts (dfmp2 takes OMP_NUM_THREADS as its default), so that two workers do not
# spin four OpenMP threads on two cores (see single_thread below). Set before torch and
# PySCF load their OpenMP runtimes.
if "PYTEST_XDIST_WORKER" in os.environ:
    os.environ.setdefault("OMP_NUM_THREADS", "1")

import h5py
import pytest

# Shared assertion helpers of the kernel tests report like asserts written in the tests.
pytest.register_assert_rewrite("interpreter_rule_helpers", "nki_helpers")
import torch
from pyscf import df, gto, lib, scf
from pyscf.mp import dfmp2 as pyscf_dfmp2
from pyscf.mp import dfump2 as pyscf_dfump2

REPO = Path(__file__).resolve().parent.parent
MOLECULES = REPO / "molecules"


@pytest.fixture
def single_thread():
    """For tiny molecules: on a shared machine, OpenMP threads spin-waiting for a busy core
    made each of their SCF cycles 20 times slower (measured). One thread each."""
    pyscf_threads, torch_threads = lib.num_threads(), torch.get_num_threads()
    lib.num_threads(1)
    torch.set_num_threads(1)
    yield
    lib.num_threads(pyscf_threads)
    torch.set_num_threads(torch_threads)


def molecule_path(name: str) -> Path:
    return MOLECULES / f"{name}.xyz"


def pyscf_molecule(name: str, basis: str, charge: int = 0, spin: int = 0) -> gto.Mole:
    lines = molecule_path(name).read_text().splitlines()
    atoms = "\n".join(lines[2:2 + int(lines[0])])
    return gto.M(atom=atoms, basis=basis, charge=charge, spin=spin, verbose=0)


def pyscf_df_rhf(mol: gto.Mole) -> scf.hf.SCF:
    """PySCF's own density-fitted RHF, converged as tightly as dfmp2 converges it."""
    mf = scf.RHF(mol).density_fit()
    mf.conv_tol, mf.conv_tol_grad, mf.verbose = 1e-12, 1e-7, 0
    mf.kernel()
    assert mf.converged
    return mf


def pyscf_dfmp2_reference(mf, frozen: int):
    """PySCF DFMP2 (DFUMP2 for an open shell) with the RI auxiliary basis set explicitly
    (never the SCF's JK-fit basis)."""
    method = pyscf_dfump2.DFUMP2 if mf.mol.spin else pyscf_dfmp2.DFMP2
    pt = method(mf, frozen=frozen or None)
    pt.with_df = df.DF(mf.mol, auxbasis=df.make_auxbasis(mf.mol, mp2fit=True))
    pt.verbose = 0
    pt.kernel(with_t2=False)
    return pt


def stored_orbitals_e_corr(record, molecule: str = "benzene", spin: int = 0) -> float:
    """PySCF's DF-MP2 correlation energy (cc-pVDZ, RI basis) on the orbitals the record's SCF
    stored: the exact answer of a run resumed from them, or of one whose SCF stored them."""
    mol = pyscf_molecule(molecule, "cc-pvdz", spin=spin)
    mf = scf.UHF(mol) if spin else scf.RHF(mol)
    with h5py.File(record, "r") as h5:
        mf.mo_coeff, mf.mo_energy, mf.mo_occ = (h5[f"scf/{name}"][()] for name in
                                                ("mo_coeff", "mo_energy", "mo_occ"))
        mf.e_tot, mf.converged = float(h5["scf"].attrs["e_tot"]), True
    return pyscf_dfmp2_reference(mf, 0).e_corr


class CliResult:
    def __init__(self, code: int, out: str, err: str) -> None:
        self.code, self.out, self.err = code, out, err


@pytest.fixture
def slurm_batch_shell(monkeypatch):
    """The environment of an sbatch script of four tasks, in its own shell (no srun): the
    job's SLURM_NTASKS and SLURM_PROCID=0, but no step of several tasks."""
    for name, value in (("SLURM_JOB_ID", "4242"), ("SLURM_NTASKS", "4"),
                        ("SLURM_PROCID", "0"), ("SLURM_LOCALID", "0")):
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("SLURM_STEP_NUM_TASKS", raising=False)


def run_in_process(*args) -> CliResult:
    """The dfmp2 CLI run in this process as the console script runs it, its output captured
    (a process of its own pays about 2.5 s of imports). Threads are put back as they were,
    since a run sets them for the whole process."""
    from dfmp2.cli import main

    out, err = io.StringIO(), io.StringIO()
    threads = lib.num_threads(), torch.get_num_threads()
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            main([str(a) for a in args])
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    else:
        code = 0
    finally:
        lib.num_threads(threads[0])
        torch.set_num_threads(threads[1])
    return CliResult(code, out.getvalue(), err.getvalue())


@pytest.fixture
def run_cli():
    """:func:`run_in_process`, for tests that take it as a fixture."""
    return run_in_process


# The run behind :func:`water_record`; a test that resumes a copy runs these again.
WATER_RECORD_ARGS = ("run", str(Path(__file__).resolve().parents[1] / "molecules" / "water.xyz"),
                     "--basis", "sto-3g", "--occ-block", "1")


@pytest.fixture(scope="session")
def water_record(tmp_path_factory) -> Path:
    """A complete water/STO-3G record with one-orbital blocks (so it holds finished pairs),
    made once; tests that alter a record alter a copy of it."""
    from dfmp2.cli import main

    path = tmp_path_factory.mktemp("water_record") / "water.h5"
    with pytest.raises(SystemExit) as done:
        main([*WATER_RECORD_ARGS, "-o", str(path)])
    assert done.value.code == 0
    return path


def python_exe() -> str:
    return sys.executable


def process_running(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie, left unreaped where no init reaps, has ended)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"


def assert_ends_with(parent: subprocess.Popen, child: int, what: str) -> None:
    """SIGKILL ``parent`` and assert that its ``child`` ends within 5 s; a child that does
    not is killed, so that a failing test leaves nothing running."""
    parent.kill()
    parent.wait()
    try:
        for _ in range(100):
            if not process_running(child):
                break
            time.sleep(0.05)
        assert not process_running(child), f"{what} outlived its parent"
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(child, signal.SIGKILL)


def as_interrupted(record: Path, finished_pairs: int) -> None:
    """Make a complete run record look as a run killed in its energy step leaves it: status
    running, no MP2 result, only its first ``finished_pairs`` block pairs checkpointed."""
    with h5py.File(record, "r+") as h5:
        h5.attrs["status"] = "running"
        del h5["mp2"]
        pairs = h5["checkpoint/pairs"][:finished_pairs]
        sums = h5["checkpoint/sums"][:finished_pairs]
        del h5["checkpoint/pairs"], h5["checkpoint/sums"]
        h5["checkpoint/pairs"], h5["checkpoint/sums"] = pairs, sums


@pytest.fixture
def thread_counts_restored():
    """torch's, PySCF's and every BLAS pool's thread counts put back after a test that sets
    them (a count left set would hold for the rest of the worker's tests)."""
    import torch
    from pyscf import lib
    from threadpoolctl import ThreadpoolController

    before = torch.get_num_threads(), lib.num_threads()
    pools = {pool.filepath: pool.num_threads for pool in ThreadpoolController().lib_controllers}
    yield
    torch.set_num_threads(before[0])
    lib.num_threads(before[1])
    for pool in ThreadpoolController().lib_controllers:
        if pool.filepath in pools:
            pool.set_num_threads(pools[pool.filepath])
