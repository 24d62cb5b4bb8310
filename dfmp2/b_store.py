"""Where the fitted tensor B (naux, nocc*nvir) lives: in memory, or in an HDF5 scratch file.

Scratch files have names derived from the run record (:class:`ScratchArea`), so a run that was
killed can find its own: a resumed run reuses a B that was finished and belongs to the same
orbitals, and removes anything else. Every disk error becomes a :class:`ScratchError` naming
the file, and a failed file is removed.
"""
from __future__ import annotations

import errno
import logging
import os
from pathlib import Path

import h5py
import numpy as np
import torch

from dfmp2.errors import RunFailure

log = logging.getLogger(__name__)
# Column chunks of the scratch dataset: one occupied block of a typical molecule, so that the
# energy step reads whole chunks.
SCRATCH_CHUNK_BYTES = 4 * 2**20
DATASET = "b"
SIGNATURE_ATTR = "orbital_signature"


class ScratchError(RunFailure):
    """The scratch file could not be written or read."""


def _disk_error(path: Path, exc: OSError) -> ScratchError:
    reason = exc.strerror or str(exc) or type(exc).__name__
    if getattr(exc, "errno", None) in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG):
        reason = f"{os.strerror(exc.errno)}; free some space or choose another --scratch"
    return ScratchError(f"cannot write the scratch file {path}: {reason}")


class ScratchArea:
    """The scratch files of one calculation: ``<folder>/.<prefix>.b<channel>[.raw].h5``."""

    def __init__(self, folder: Path, prefix: str) -> None:
        self.folder = Path(folder)
        self.prefix = prefix

    def path(self, channel: int, raw: bool = False) -> Path:
        return self.folder / f".{self.prefix}.b{channel}{'.raw' if raw else ''}.h5"

    def leftovers(self) -> list[Path]:
        return sorted(self.folder.glob(f".{self.prefix}.b*.h5"))

    def remove_leftovers(self) -> None:
        for path in self.leftovers():
            log.info("removing the scratch file %s of an earlier run", path)
            path.unlink(missing_ok=True)


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

    def mark_complete(self, signature: str) -> None:
        """Nothing to keep: an in-memory B does not outlive the run."""

    def close(self) -> None:
        self.data = torch.empty(0)


class ScratchB:
    """B in an HDF5 scratch file, chunked by columns; deleted on close by its owner."""

    location = "scratch"

    def __init__(self, path: Path, file: h5py.File, owner: bool) -> None:
        self.path, self.file, self.owner = Path(path), file, owner
        self.dataset = file[DATASET]

    @classmethod
    def create(cls, path: Path, naux: int, ncols: int) -> "ScratchB":
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            file = h5py.File(path, "w")
            chunk_cols = max(1, min(ncols, SCRATCH_CHUNK_BYTES // (8 * naux)))
            file.create_dataset(DATASET, shape=(naux, ncols), dtype="f8",
                                chunks=(naux, chunk_cols))
        except OSError as exc:
            path.unlink(missing_ok=True)
            raise _disk_error(path, exc) from None
        log.info("B (%d x %d) in scratch file %s", naux, ncols, path)
        return cls(path, file, owner=True)

    @classmethod
    def reopen_complete(cls, path: Path, shape: tuple[int, int],
                        signature: str) -> "ScratchB | None":
        """A finished B left by a killed run on the same orbitals, or None (and the file is
        removed) when it is unfinished, damaged or from other orbitals."""
        if not path.exists():
            return None
        try:
            file = h5py.File(path, "r")
        except OSError:
            log.info("scratch file %s is damaged; it will be rebuilt", path)
            path.unlink(missing_ok=True)
            return None
        dataset = file.get(DATASET)
        if (dataset is None or tuple(dataset.shape) != tuple(shape)
                or dataset.attrs.get(SIGNATURE_ATTR) != signature):
            file.close()
            log.info("scratch file %s is unfinished or from other orbitals; it will be "
                     "rebuilt", path)
            path.unlink(missing_ok=True)
            return None
        log.info("reusing the fitted B in scratch file %s", path)
        return cls(path, file, owner=True)

    @classmethod
    def open_shared(cls, path: Path) -> "ScratchB":
        """Another rank's finished B, read-only; the rank that wrote it deletes it."""
        try:
            return cls(path, h5py.File(path, "r"), owner=False)
        except OSError as exc:
            raise ScratchError(f"cannot read the shared scratch file {path}: "
                               f"{exc.strerror or exc}") from None

    @property
    def shape(self) -> tuple[int, int]:
        return tuple(self.dataset.shape)

    def write_rows(self, p0: int, p1: int, rows: torch.Tensor) -> None:
        self._write(np.s_[p0:p1], rows)

    def read_columns(self, c0: int, c1: int) -> torch.Tensor:
        out = np.empty((self.dataset.shape[0], c1 - c0))
        try:
            self.dataset.read_direct(out, np.s_[:, c0:c1])
        except OSError as exc:
            raise ScratchError(f"cannot read the scratch file {self.path}: "
                               f"{exc.strerror or exc}") from None
        return torch.from_numpy(out)

    def write_columns(self, c0: int, c1: int, values: torch.Tensor) -> None:
        self._write(np.s_[:, c0:c1], values)

    def _write(self, where, values: torch.Tensor) -> None:
        try:
            self.dataset[where] = values.numpy()
        except OSError as exc:
            raise _disk_error(self.path, exc) from None

    def mark_complete(self, signature: str) -> None:
        """Say, durably, that B is finished for these orbitals (a killed run's successor may
        then reuse it)."""
        try:
            self.dataset.attrs[SIGNATURE_ATTR] = signature
            self.file.flush()
        except OSError as exc:
            raise _disk_error(self.path, exc) from None

    def share(self) -> Path:
        """Close the writer and reopen read-only, so that other ranks can open the file."""
        self.file.close()
        self.file = h5py.File(self.path, "r")
        self.dataset = self.file[DATASET]
        return self.path

    def close(self) -> None:
        if self.file:
            try:
                self.file.close()
            except OSError:
                log.warning("closing the scratch file %s failed", self.path)
            self.file = None
        if self.owner:
            self.path.unlink(missing_ok=True)


def open_store(naux: int, ncols: int, path: Path | None):
    """B in the scratch file ``path``, or in memory when there is none."""
    if path is not None:
        return ScratchB.create(path, naux, ncols)
    return InMemoryB(naux, ncols)
