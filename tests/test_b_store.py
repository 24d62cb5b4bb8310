"""The tensor stores: a scratch file gives back exactly what the in-memory store gives, for any
window of rows and columns, including windows that cut through its column chunks."""
from __future__ import annotations

import ctypes
import json
import os

import numpy as np
import pytest
import torch

from dfmp2.df import store as b_store
from dfmp2.df.store import open_store


def test_file_and_memory_stores_read_the_same_windows(tmp_path, monkeypatch):
    # 3 columns per chunk for 8 rows, so that windows start and end inside chunks.
    monkeypatch.setattr(b_store, "SCRATCH_CHUNK_BYTES", 3 * 8 * 8)
    values = torch.from_numpy(np.random.default_rng(7).standard_normal((8, 11)))
    memory = open_store(8, 11, None)
    scratch = open_store(8, 11, tmp_path / "t.bin")
    assert scratch.chunk_cols == 3
    for store in (memory, scratch):
        store.write_rows(0, 5, values[:5])
        store.write_columns(0, 11, values)
    try:
        for p0, p1, c0, c1 in [(0, 8, 0, 11), (2, 5, 1, 4), (0, 1, 10, 11), (3, 8, 2, 9),
                               (5, 6, 3, 6)]:
            expected = values[p0:p1, c0:c1]
            assert torch.equal(memory.read_rows(p0, p1, c0, c1), expected)
            assert torch.equal(scratch.read_rows(p0, p1, c0, c1), expected)
        assert torch.equal(scratch.read_rows(2, 4), values[2:4])
        assert torch.equal(scratch.read_columns(4, 10), values[:, 4:10])
    finally:
        memory.close()
        scratch.close()
    assert list(tmp_path.iterdir()) == []


def test_a_store_keeps_some_rows_in_place_and_gives_the_rest_back(tmp_path, monkeypatch):
    """The JK-fit tensor drops its screened pairs' rows once it is built: both stores then
    hold exactly the kept rows in their order, the file is shorter, and the memory of the
    dropped rows is back with the system (a store moves rows in several steps here)."""
    monkeypatch.setattr(b_store, "SCRATCH_CHUNK_BYTES", 3 * 8 * 40)
    monkeypatch.setattr(b_store, "KEEP_ROWS_BYTES", 5 * 8 * 1024)
    rng = np.random.default_rng(8)
    values = torch.from_numpy(rng.standard_normal((40, 11)))
    rows = np.flatnonzero(rng.random(40) < 0.6)
    rows = rows[rows > 0]
    memory = open_store(40, 11, None)
    scratch = open_store(40, 11, tmp_path / "t.bin")
    assert scratch.chunk_cols == 3
    try:
        for store in (memory, scratch):
            store.write_rows(0, 40, values)
            store.keep_rows(rows)
            assert store.shape == (len(rows), 11)
            assert torch.equal(store.read_rows(0, len(rows)), values[rows])
            assert torch.equal(store.read_rows(1, 4, 2, 9), values[rows[1:4], 2:9])
        assert (tmp_path / "t.bin").stat().st_size == b_store.HEADER_BYTES + 8 * len(rows) * 11
    finally:
        memory.close()
        scratch.close()

    # The store's own mapping is measured: the process's resident memory also moved with
    # whatever else the test worker freed or allocated meanwhile (19 MB once in CI).
    block = torch.ones((512, 1024), dtype=torch.float64)
    large = open_store(4096, 1024, None)
    for row in range(0, 4096, 512):
        large.write_rows(row, row + 512, block)
    address, size = large.data.data_ptr(), 4096 * 1024 * 8
    assert _resident_kib(address, size) == size // 1024
    large.keep_rows(np.arange(0, 4096, 8))
    assert _resident_kib(address, size) <= size // 8 // 1024 + 4
    assert torch.equal(large.read_rows(0, 512), block)
    large.close()


def _resident_kib(address: int, size: int) -> int:
    """The resident KiB of this process's pages in [address, address + size), by mincore:
    the mapping's Rss in /proc/self/smaps also counted an anonymous neighbour that the
    system had merged into it (40,700 KiB for a 32,768 KiB store, once in CI)."""
    page = os.sysconf("SC_PAGE_SIZE")
    start = address - address % page
    pages = (address + size - start + page - 1) // page
    resident = (ctypes.c_ubyte * pages)()
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mincore.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p)
    if libc.mincore(ctypes.c_void_p(start), ctypes.c_size_t(pages * page), resident) != 0:
        raise OSError(ctypes.get_errno(), "mincore failed")
    return sum(flag & 1 for flag in resident) * page // 1024


def test_a_store_the_system_cannot_map_is_out_of_memory(monkeypatch):
    """The in-memory store maps its own pages; a refused mapping (ENOMEM, where the system
    does not overcommit) reads as an allocator's failure, which a run reports as out of
    memory, not as a traceback."""
    import errno
    import mmap

    from dfmp2.system.memory import out_of_memory

    def refused(*args, **kwargs):
        raise OSError(errno.ENOMEM, "Cannot allocate memory")

    monkeypatch.setattr(mmap, "mmap", refused)
    with pytest.raises(MemoryError) as failure:
        open_store(1000, 1000, None)
    assert out_of_memory(failure.value)


def test_another_rank_opens_only_the_file_rank_0_made(tmp_path):
    """A rank whose scratch folder was its node's own opened, by rank 0's path, a killed
    run's file of that name there and read another calculation's B (water octamer on two
    ranks: E_tot 6e-3 Eh off, status 0). The file's token tells them apart."""
    path = tmp_path / ".w.h5.b0.bin"
    made = b_store.ScratchB.create(path, 3, 4)
    made.write_rows(0, 3, torch.ones(3, 4))
    shared = made.share()
    seen = b_store.ScratchB.open_shared(shared)
    assert torch.equal(seen.read_rows(0, 3), torch.ones(3, 4))
    seen.close()
    elsewhere = tmp_path / "node1"
    elsewhere.mkdir()
    stale = b_store.ScratchB.create(elsewhere / path.name, 3, 4)
    with pytest.raises(b_store.ScratchError, match="the ranks do not share the scratch folder"):
        b_store.ScratchB.open_shared(b_store.SharedFile(str(stale.path), shared.token))
    stale.close()
    made.close()


def test_a_finished_file_without_a_token_is_rebuilt(tmp_path):
    """An older dfmp2's finished B has no token to check on the other ranks: not reused."""
    path = tmp_path / ".w.h5.b0.bin"
    made = b_store.ScratchB.create(path, 3, 4)
    made.owner = False
    made.mark_complete("orbitals")
    made.close()
    reopened = b_store.ScratchB.reopen_complete(path, (3, 4), "orbitals")
    assert reopened is not None
    reopened.owner = False
    reopened.close()
    fd = os.open(path, os.O_RDWR)
    header = b_store._read_header(fd)
    del header[b_store.TOKEN]
    os.pwrite(fd, json.dumps(header).encode().ljust(b_store.HEADER_BYTES), 0)
    os.close(fd)
    assert b_store.ScratchB.reopen_complete(path, (3, 4), "orbitals") is None
    assert not path.exists()
