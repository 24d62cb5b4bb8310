"""Where the fitted tensor B (naux, nocc*nvir) lives: in memory, or in an HDF5 scratch file."""
from __future__ import annotations

import logging
import os
import tempfile
from pathlib import Path

import h5py
import numpy as np
import torch

log = logging.getLogger(__name__)
# Column chunks of the scratch dataset: one occupied block of a typical molecule, so that the
# energy step reads whole chunks.
SCRATCH_CHUNK_BYTES = 4 * 2**20


class InMemoryB:
    """B as one fp64 torch tensor."""

    location = "memory"

    def __init__(self, naux: int, ncols: int) -> None:
        self.data = torch.empty((naux, ncols), dtype=torch.float64)

    @property
    def shape(self) -> tuple[int, int]:
        return tuple(self.data.shape)

    def write_rows(self, p0: int, p1: int, rows: torch.Tensor) -> None:
        self.data[p0:p1] = rows

    def read_columns(self, c0: int, c1: int) -> torch.Tensor:
        return self.data[:, c0:c1]

    def write_columns(self, c0: int, c1: int, values: torch.Tensor) -> None:
        target = self.data[:, c0:c1]
        if not values.is_set_to(target):
            target.copy_(values)

    def close(self) -> None:
        self.data = torch.empty(0)


class ScratchB:
    """B in an HDF5 scratch file, chunked by columns; deleted on close."""

    location = "scratch"

    def __init__(self, naux: int, ncols: int, directory: Path) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        fd, name = tempfile.mkstemp(prefix=".dfmp2-scratch-", suffix=".h5", dir=directory)
        os.close(fd)
        self.path = Path(name)
        self.owner = True
        self.file = h5py.File(self.path, "w")
        chunk_cols = max(1, min(ncols, SCRATCH_CHUNK_BYTES // (8 * naux)))
        self.dataset = self.file.create_dataset("b", shape=(naux, ncols), dtype="f8",
                                                chunks=(naux, chunk_cols))
        log.info("B (%d x %d) in scratch file %s", naux, ncols, self.path)

    @property
    def shape(self) -> tuple[int, int]:
        return tuple(self.dataset.shape)

    def write_rows(self, p0: int, p1: int, rows: torch.Tensor) -> None:
        self.dataset[p0:p1] = rows.numpy()

    def read_columns(self, c0: int, c1: int) -> torch.Tensor:
        out = np.empty((self.dataset.shape[0], c1 - c0))
        self.dataset.read_direct(out, np.s_[:, c0:c1])
        return torch.from_numpy(out)

    def write_columns(self, c0: int, c1: int, values: torch.Tensor) -> None:
        self.dataset[:, c0:c1] = values.numpy()

    @classmethod
    def open_shared(cls, path: Path) -> "ScratchB":
        """Another rank's finished B, read-only; the rank that wrote it deletes it."""
        store = cls.__new__(cls)
        store.path, store.owner = Path(path), False
        store.file = h5py.File(store.path, "r")
        store.dataset = store.file["b"]
        return store

    def share(self) -> Path:
        """Close the writer and reopen read-only, so that other ranks can open the file."""
        self.file.close()
        self.file = h5py.File(self.path, "r")
        self.dataset = self.file["b"]
        return self.path

    def close(self) -> None:
        if self.file:
            self.file.close()
            self.file = None
        if self.owner:
            self.path.unlink(missing_ok=True)


def open_store(naux: int, ncols: int, out_of_core: bool, scratch_dir: Path | None):
    if out_of_core:
        return ScratchB(naux, ncols, scratch_dir or Path("."))
    return InMemoryB(naux, ncols)
