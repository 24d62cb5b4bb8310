"""The tensor stores: a scratch file gives back exactly what the in-memory store gives, for any
window of rows and columns, including windows that cut through its column chunks."""
from __future__ import annotations

import numpy as np
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
