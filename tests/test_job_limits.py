"""The defaults within a job's limits: the memory budget within its control group's memory
limit and ``ulimit -v``, the thread count within its CPU quota.

Under Slurm's ``--mem`` or a container's limit, /proc/meminfo shows the whole node: the
default budget (60% of the memory available) planned tensors the job could not hold, and the
kernel killed it with nothing saved. A container's CPU quota is not in the affinity mask: a
run took a thread per host core and was throttled. The control groups are fake folders here,
laid out as cgroup v2 and v1 lay them out.
"""
from __future__ import annotations

import logging
import resource

import h5py
import pytest

from conftest import molecule_path
from dfmp2.system import memory, limits

GB = 10**9


def _write(folder, **files) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (folder / name.replace("_", ".", 1)).write_text(text)


@pytest.fixture
def cgroups(tmp_path, monkeypatch):
    """A job's cgroup v2 tree: the job limited to 4 GB, using 1 GB of which 0.5 GB is
    inactive page cache, its step below it unlimited."""
    root = tmp_path / "cgroup"
    _write(root / "slurm" / "job_1", memory_max=f"{4 * GB}\n", memory_current=f"{GB}\n",
           memory_stat=f"anon 400000000\ninactive_file {GB // 2}\n")
    _write(root / "slurm" / "job_1" / "step_0", memory_max="max\n",
           memory_current=f"{GB - 10**8}\n", memory_stat="inactive_file 0\n")
    proc = tmp_path / "cgroup_of_self"
    proc.write_text("0::/slurm/job_1/step_0\n")
    monkeypatch.setattr(limits, "CGROUP_ROOT", root)
    monkeypatch.setattr(limits, "PROC_CGROUP", proc)
    return root, proc


def test_the_tightest_limit_above_the_process_sets_its_headroom(cgroups):
    assert limits.cgroup_headroom() == (4 * GB - GB // 2, 4 * GB)
    assert memory.available_bytes() == 4 * GB - GB // 2
    assert memory.memory_budget(None) == int(memory.DEFAULT_FRACTION_OF_AVAILABLE
                                              * (4 * GB - GB // 2))


def test_cgroup_v1_limits_and_its_unlimited_root(tmp_path, monkeypatch):
    root = tmp_path / "cgroup"
    v1 = root / "memory"
    _write(v1, memory_limit_in_bytes="9223372036854771712\n",
           memory_usage_in_bytes=f"{3 * GB}\n", memory_stat="total_inactive_file 0\n")
    _write(v1 / "job", memory_limit_in_bytes=f"{2 * GB}\n",
           memory_usage_in_bytes=f"{3 * GB // 2}\n",
           memory_stat=f"inactive_file {GB}\ntotal_inactive_file {GB}\n")
    proc = tmp_path / "cgroup_of_self"
    proc.write_text("5:cpu,cpuacct:/job\n4:memory:/job\n0::/\n")
    monkeypatch.setattr(limits, "CGROUP_ROOT", root)
    monkeypatch.setattr(limits, "PROC_CGROUP", proc)
    assert limits.cgroup_headroom() == (2 * GB - GB // 2, 2 * GB)
    proc.write_text("5:cpu,cpuacct:/job\n")
    assert limits.cgroup_headroom() is None
    proc.unlink()
    assert limits.cgroup_headroom() is None


def test_ulimit_v_leaves_what_is_not_yet_mapped(tmp_path, monkeypatch):
    status = tmp_path / "status"
    status.write_text("Name:\tpython\nVmPeak:\t 2000000 kB\nVmSize:\t 1000000 kB\n")
    monkeypatch.setattr(limits, "PROC_STATUS", status)
    monkeypatch.setattr(limits.resource, "getrlimit",
                        lambda which: (3 * GB, resource.RLIM_INFINITY))
    assert limits.address_space_headroom() == 3 * GB - 1024 * 10**6
    assert memory.available_bytes() <= 3 * GB - 1024 * 10**6


def test_a_budget_above_the_jobs_limit_is_warned_of(cgroups, caplog):
    assert memory.memory_budget(8 * GB) == 8 * GB
    assert "more than the 4.0 GB memory limit of this job" in caplog.text
    caplog.clear()
    assert memory.memory_budget(2 * GB) == 2 * GB
    assert not caplog.text


def test_a_run_without_memory_plans_within_its_jobs_limit(cgroups, run_cli, tmp_path,
                                                           caplog):
    caplog.set_level(logging.WARNING)
    record = tmp_path / "w.h5"
    result = run_cli("run", molecule_path("water"), "--basis", "sto-3g", "-o", record)
    assert result.code == 0, result.err
    with h5py.File(record, "r") as h5:
        budget = h5["input"].attrs["memory_bytes"]
    assert budget == int(memory.DEFAULT_FRACTION_OF_AVAILABLE * (4 * GB - GB // 2))


@pytest.mark.parametrize("version, files, expected", [
    (2, {"cpu.max": "250000 100000\n"}, 2),
    (2, {"cpu.max": "max 100000\n"}, None),
    (2, {"cpu.max": "50000 100000\n"}, 1),
    (1, {"cpu.cfs_quota_us": "300000\n", "cpu.cfs_period_us": "100000\n"}, 3),
    (1, {"cpu.cfs_quota_us": "-1\n", "cpu.cfs_period_us": "100000\n"}, None)])
@pytest.mark.usefixtures("thread_counts_restored")
def test_a_cpu_quota_caps_the_default_thread_count(tmp_path, monkeypatch, version, files,
                                                   expected):
    from dfmp2.jobs.preamble import apply_threads

    root = tmp_path / "cgroup"
    folder = root / ("kubepods/pod1" if version == 2 else "cpu,cpuacct/kubepods/pod1")
    folder.mkdir(parents=True)
    for name, text in files.items():
        (folder / name).write_text(text)
    proc = tmp_path / "cgroup_of_self"
    proc.write_text("0::/kubepods/pod1\n" if version == 2
                    else "3:cpu,cpuacct:/kubepods/pod1\n4:memory:/kubepods/pod1\n")
    monkeypatch.setattr(limits, "CGROUP_ROOT", root)
    monkeypatch.setattr(limits, "PROC_CGROUP", proc)
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: set(range(8)))
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    assert limits.cpu_quota_cores() == expected
    assert apply_threads(None) == (expected or 8)

