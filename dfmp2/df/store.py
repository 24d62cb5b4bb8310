"""Where the fitted tensor B (naux, nocc*nvir) lives: in memory, or in a scratch file.

Scratch files have names derived from the run record (:class:`ScratchArea`), so a run that was
killed can find its own: a resumed run reuses a B that was finished and belongs to the same
orbitals, and removes anything else. Every disk error becomes a :class:`ScratchError` naming
the file, and a failed file is removed.
"""
from __future__ import annotations

import errno
import glob
import json
import logging
import mmap
import os
import secrets
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from dfmp2.errors import RunFailure
from dfmp2.system.files import create_exclusive, disk_reason, refuse_unless_regular
from dfmp2.system.memory import FP64_BYTES

log = logging.getLogger(__name__)
# Column chunks of the scratch file: one occupied block of a typical molecule, so that the
# energy step reads whole chunks.
SCRATCH_CHUNK_BYTES = 4 * 2**20
HEADER_BYTES = 4096
FORMAT = "dfmp2.scratch-b/1"
SIGNATURE = "orbital_signature"
# The header's random name of the file, drawn when it is made: another rank opening the file
# by its path checks it reaches this file, not one of that name in a folder of its own.
TOKEN = "token"
# The header's record of the kernel calls that built a finished B.
KERNEL_CALLS = "kernel_calls"
REMEDY = "choose another -o or --scratch"
# Rows moved at once when a store keeps only some of its rows.
KEEP_ROWS_BYTES = 32 * 2**20


class ScratchError(RunFailure):
    """The scratch file could not be written or read."""


@dataclass(frozen=True)
class SharedFile:
    """What another rank needs to open a scratch file: its path and its header's token."""

    path: str
    token: str


def _disk_error(path: Path, exc: OSError) -> ScratchError:
    reason = disk_reason(exc, "free some space or choose another --scratch")
    return ScratchError(f"cannot write the scratch file {path}: {reason}")


class ScratchArea:
    """The scratch files of one calculation: ``<folder>/.<prefix>.b<channel>[.raw].bin`` for
    MP2's B, ``<folder>/.<prefix>.jk.bin`` for the SCF's JK-fit tensor and
    ``<folder>/.<prefix>.<name>.bin`` for any other tensor."""

    def __init__(self, folder: Path, prefix: str) -> None:
        self.folder = Path(folder)
        self.prefix = prefix

    def path(self, channel: int, raw: bool = False) -> Path:
        return self.folder / f".{self.prefix}.b{channel}{'.raw' if raw else ''}.bin"

    def named(self, name: str) -> Path:
        return self.folder / f".{self.prefix}.{name}.bin"

    def jk_path(self) -> Path:
        return self.folder / f".{self.prefix}.jk.bin"

    def area(self, name: str) -> "ScratchArea":
        """The files of one stage (e.g. the gradient's): their own prefix, so that stage's
        leftovers are removed without touching the files of the stages around it."""
        return ScratchArea(self.folder, f"{self.prefix}.{name}")

    def pin(self, path: Path) -> "PinnedFile":
        """Create ``path`` (one of this area's names) empty and hold it open, for a writer
        that opens files by name (PySCF's JK tensor and DIIS file): a link there is refused
        and an earlier run's file replaced."""
        try:
            return PinnedFile(path, create_exclusive(path, REMEDY))
        except OSError as exc:
            raise _disk_error(path, exc) from None

    def leftovers(self) -> list[Path]:
        # The prefix is a record's name, not a pattern: '*.h5' must not take other files.
        return sorted(self.folder.glob(f".{glob.escape(self.prefix)}.*.bin"))

    def remove_leftovers(self) -> None:
        for path in self.leftovers():
            refuse_unless_regular(path, REMEDY)
            log.info("removing the scratch file %s of an earlier run", path)
            path.unlink(missing_ok=True)


class PinnedFile:
    """A scratch file dfmp2 created and holds open. A writer that opens files by name is
    given :attr:`name`, this process's own descriptor of it (``/proc/self/fd/N``), which
    reaches the file created here even when the folder's entry is replaced by a link
    after the creation (the writer, PySCF through h5py, would follow a link there). Without
    ``/proc`` the name is the path."""

    def __init__(self, path: Path, fd: int) -> None:
        self.path = path
        self.fd: int | None = fd

    @property
    def name(self) -> str:
        own = Path(f"/proc/self/fd/{self.fd}")
        return str(own) if own.exists() else str(self.path)

    def remove(self) -> None:
        """Remove the folder's entry (unlinking never follows a link) and let the file go."""
        self.path.unlink(missing_ok=True)
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


class InMemoryB:
    """B as one fp64 torch tensor in an anonymous private mapping of its own: its pages are
    zero until written, and those of rows that :meth:`keep_rows` drops go back to the system
    (memory from the allocator could not be given back in part)."""

    location = "memory"

    def __init__(self, naux: int, ncols: int) -> None:
        self._mapping = None
        if naux * ncols == 0:
            self.data = torch.zeros((naux, ncols), dtype=torch.float64)
            return
        try:
            self._mapping = mmap.mmap(-1, FP64_BYTES * naux * ncols,
                                      flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        except OSError as exc:
            if exc.errno != errno.ENOMEM:
                raise
            # As an allocator's failure reads, so that the run says it ran out of memory.
            raise MemoryError(f"cannot map {FP64_BYTES * naux * ncols} bytes for a "
                              f"{naux} x {ncols} tensor") from None
        self.data = torch.frombuffer(self._mapping, dtype=torch.float64).view(naux, ncols)

    @property
    def shape(self) -> tuple[int, int]:
        return tuple(self.data.shape)

    def write_rows(self, p0: int, p1: int, rows: torch.Tensor) -> None:
        target = self.data[p0:p1]
        if not rows.is_set_to(target):
            target.copy_(rows)

    def read_rows(self, p0: int, p1: int, c0: int = 0, c1: int | None = None) -> torch.Tensor:
        return self.data[p0:p1, c0:c1]

    def read_columns(self, c0: int, c1: int) -> torch.Tensor:
        return self.data[:, c0:c1]

    def write_columns(self, c0: int, c1: int, values: torch.Tensor) -> None:
        target = self.data[:, c0:c1]
        if not values.is_set_to(target):
            target.copy_(values)

    def keep_rows(self, rows: np.ndarray) -> None:
        """Only ``rows`` (ascending) stay, moved up in place in their order; the memory of
        the others goes back to the system."""
        ncols = self.data.shape[1]
        step = max(1, KEEP_ROWS_BYTES // (FP64_BYTES * max(1, ncols)))
        for k0 in range(0, len(rows), step):
            # Each row moves to a row at or above it, so the rows still to move are intact;
            # the index copies the rows before they are written.
            moving = rows[k0:k0 + step]
            self.data[k0:k0 + len(moving)] = self.data[torch.from_numpy(moving)]
        self.data = self.data[:len(rows)]
        if self._mapping is not None and hasattr(self._mapping, "madvise"):
            start = -(-FP64_BYTES * len(rows) * ncols // mmap.PAGESIZE) * mmap.PAGESIZE
            if start < len(self._mapping):
                self._mapping.madvise(mmap.MADV_DONTNEED, start, len(self._mapping) - start)

    def mark_complete(self, signature: str, kernel_calls: dict | None = None) -> None:
        """Nothing to keep: an in-memory B does not outlive the run."""

    def close(self) -> None:
        self.data = torch.empty(0)
        self._mapping = None


class ScratchB:
    """B in a scratch file, deleted on close by its owner.

    The file is a 4 KiB JSON header followed by column chunks, each chunk a contiguous
    (naux, chunk_cols) fp64 block: a block of columns (the energy step's read) and a block of
    rows within a chunk (the integral build's write) are both contiguous. It is read and
    written with plain ``pread``/``pwrite``, so a full disk is an ordinary error here (the
    HDF5 library can crash the process when a write fails under it).
    """

    location = "scratch"

    def __init__(self, path: Path, fd: int, header: dict, owner: bool) -> None:
        self.path, self.fd, self.owner = Path(path), fd, owner
        self.header = header
        self.naux, self.ncols = header["shape"]
        self.chunk_cols = header["chunk_cols"]

    @classmethod
    def create(cls, path: Path, naux: int, ncols: int, parts: int = 1) -> "ScratchB":
        """A new file; with ``parts`` > 1 its chunks come in a multiple of ``parts`` (each no
        wider than usual), so that that many writers can each take whole chunks of about the
        same width."""
        path.parent.mkdir(parents=True, exist_ok=True)
        chunk_cols = max(1, min(ncols, SCRATCH_CHUNK_BYTES // (FP64_BYTES * naux)))
        if parts > 1 and ncols > 0:
            nchunks = parts * -(-ncols // (parts * chunk_cols))
            chunk_cols = max(1, -(-ncols // nchunks))
        header = {"format": FORMAT, "shape": [naux, ncols], "chunk_cols": chunk_cols,
                  SIGNATURE: None, TOKEN: secrets.token_hex(16)}
        try:
            fd = create_exclusive(path, REMEDY)
        except OSError as exc:
            raise _disk_error(path, exc) from None
        store = cls(path, fd, header, owner=True)
        try:
            store._write_header()
            # Full length at once (a sparse file): what is read before it is written is zero.
            os.ftruncate(fd, HEADER_BYTES + FP64_BYTES * naux * ncols)
        except OSError as exc:
            store.close()
            raise _disk_error(path, exc) from None
        except ScratchError:
            store.close()
            raise
        log.info("a %d x %d tensor in scratch file %s", naux, ncols, path)
        return store

    @classmethod
    def reopen_complete(cls, path: Path, shape: tuple[int, int],
                        signature: str) -> "ScratchB | None":
        """A finished B left by a killed run on the same orbitals, or None (and the file is
        removed) when it is unfinished, damaged or from other orbitals."""
        refuse_unless_regular(path, REMEDY)
        if not path.exists():
            return None
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
        except OSError:
            path.unlink(missing_ok=True)
            return None
        header = _read_header(fd)
        expected_size = HEADER_BYTES + FP64_BYTES * shape[0] * shape[1]
        # A file without a token (an older dfmp2's) could not be shared safely: rebuilt.
        if (header is None or header.get("shape") != list(shape)
                or header.get(SIGNATURE) != signature or not header.get(TOKEN)
                or os.fstat(fd).st_size != expected_size):
            os.close(fd)
            log.info("scratch file %s is unfinished, damaged or from other orbitals; it will "
                     "be rebuilt", path)
            path.unlink(missing_ok=True)
            return None
        log.info("reusing the fitted B in scratch file %s", path)
        return cls(path, fd, header, owner=True)

    @classmethod
    def open_shared(cls, shared: SharedFile, writable: bool = False) -> "ScratchB":
        """Another rank's finished B, read-only, or (``writable``) its new file for this rank
        to write its share into; the rank that created it deletes it. A file of that path
        that is not the one the other rank made (its token differs: a scratch folder that is
        each node's own, holding a killed run's file of that name) is refused: read, it gave
        another calculation's B (water octamer 6e-3 Eh off, status 0)."""
        path = Path(shared.path)
        try:
            fd = os.open(path, (os.O_RDWR if writable else os.O_RDONLY) | os.O_NOFOLLOW)
        except OSError as exc:
            raise ScratchError(f"cannot read the shared scratch file {path}: "
                               f"{exc.strerror or exc}") from None
        header = _read_header(fd)
        if header is None:
            os.close(fd)
            raise ScratchError(f"the shared scratch file {path} is damaged")
        if header.get(TOKEN) != shared.token:
            os.close(fd)
            raise ScratchError(f"the scratch file {path} this rank sees is not the one rank 0 "
                               "made there: the ranks do not share the scratch folder; give "
                               "--scratch a folder every node sees (a shared file system)")
        return cls(path, fd, header, owner=False)

    @property
    def shape(self) -> tuple[int, int]:
        return self.naux, self.ncols

    def _chunks(self, c0: int, c1: int):
        """(chunk start column, chunk width, first and last column of [c0, c1) inside it)."""
        first = c0 // self.chunk_cols * self.chunk_cols
        for start in range(first, c1, self.chunk_cols):
            width = min(self.chunk_cols, self.ncols - start)
            yield start, width, max(c0, start) - start, min(c1, start + width) - start

    def _offset(self, chunk_start: int) -> int:
        return HEADER_BYTES + FP64_BYTES * self.naux * chunk_start

    def write_rows(self, p0: int, p1: int, rows: torch.Tensor) -> None:
        values = np.ascontiguousarray(rows.numpy(), dtype=np.float64)
        for start, width, _, _ in self._chunks(0, self.ncols):
            block = np.ascontiguousarray(values[:, start:start + width])
            self._pwrite(block, self._offset(start) + FP64_BYTES * p0 * width)

    def read_rows(self, p0: int, p1: int, c0: int = 0, c1: int | None = None) -> torch.Tensor:
        """Rows [p0, p1) of columns [c0, c1) (default: all), reading only the column chunks
        that hold them."""
        c1 = self.ncols if c1 is None else c1
        out = torch.empty((p1 - p0, c1 - c0), dtype=torch.float64)
        # One read buffer for all chunks: a fresh one per chunk costs its page faults again.
        staging = np.empty((p1 - p0) * self.chunk_cols)
        for start, width, lo, hi in self._chunks(c0, c1):
            piece = staging[:(p1 - p0) * width]
            self._pread_into(piece, self._offset(start) + FP64_BYTES * p0 * width)
            # Narrow chunks (a few columns of a tall tensor) make this a strided copy, which
            # torch does about three times faster than numpy (measured).
            out[:, start + lo - c0:start + hi - c0].copy_(
                torch.from_numpy(piece).view(p1 - p0, width)[:, lo:hi])
        return out

    def write_columns(self, c0: int, c1: int, values: torch.Tensor) -> None:
        values = values.numpy()
        for start, width, lo, hi in self._chunks(c0, c1):
            piece = values[:, start + lo - c0:start + hi - c0]
            if lo == 0 and hi == width:
                self._pwrite(np.ascontiguousarray(piece, dtype=np.float64), self._offset(start))
            else:
                chunk = self._read_chunk(start, width)
                chunk[:, lo:hi] = piece
                self._pwrite(chunk, self._offset(start))

    def read_columns(self, c0: int, c1: int) -> torch.Tensor:
        return self.read_rows(0, self.naux, c0, c1)

    def keep_rows(self, rows: np.ndarray) -> None:
        """Only ``rows`` (ascending) stay, in place, and the file shrinks to them. Each column
        chunk keeps its columns with fewer rows, so it moves to an offset at or before its
        own and ends before the next chunk starts: every chunk is read before anything is
        written over it."""
        index = torch.from_numpy(rows)
        kept = len(rows)
        for start, width, _, _ in self._chunks(0, self.ncols):
            block = self.read_rows(0, self.naux, start, start + width)[index]
            self._pwrite(np.ascontiguousarray(block.numpy()),
                         HEADER_BYTES + FP64_BYTES * kept * start)
        self.naux = kept
        self.header["shape"] = [kept, self.ncols]
        self._write_header()
        try:
            os.ftruncate(self.fd, HEADER_BYTES + FP64_BYTES * kept * self.ncols)
        except OSError as exc:
            raise _disk_error(self.path, exc) from None

    def _read_chunk(self, start: int, width: int) -> np.ndarray:
        data = self._pread(FP64_BYTES * self.naux * width, self._offset(start))
        return np.frombuffer(data, dtype=np.float64).reshape(self.naux, width).copy()

    def _pread_into(self, buffer: np.ndarray, offset: int) -> None:
        view = memoryview(buffer).cast("B")
        try:
            while view:
                count = os.preadv(self.fd, [view], offset)
                if count == 0:
                    raise ScratchError(f"the scratch file {self.path} is shorter than its "
                                       "tensor")
                view, offset = view[count:], offset + count
        except OSError as exc:
            raise ScratchError(f"cannot read the scratch file {self.path}: "
                               f"{exc.strerror or exc}") from None

    def _pread(self, nbytes: int, offset: int) -> bytes:
        try:
            data = os.pread(self.fd, nbytes, offset)
        except OSError as exc:
            raise ScratchError(f"cannot read the scratch file {self.path}: "
                               f"{exc.strerror or exc}") from None
        if len(data) != nbytes:
            raise ScratchError(f"the scratch file {self.path} is shorter than its tensor")
        return data

    def _pwrite(self, array: np.ndarray, offset: int) -> None:
        data = memoryview(array).cast("B")
        try:
            while data:
                written = os.pwrite(self.fd, data, offset)
                data, offset = data[written:], offset + written
        except OSError as exc:
            raise _disk_error(self.path, exc) from None

    def _write_header(self) -> None:
        text = json.dumps(self.header).encode()
        self._pwrite(np.frombuffer(text.ljust(HEADER_BYTES), dtype=np.uint8), 0)

    def mark_complete(self, signature: str, kernel_calls: dict | None = None) -> None:
        """Say, durably, that B is finished for these orbitals (a killed run's successor may
        then reuse it), with the kernel calls that built it (``kernel_calls``, JSON-ready),
        which a run that reuses it counts as its own."""
        try:
            os.fsync(self.fd)
            self.header[SIGNATURE] = signature
            if kernel_calls is not None:
                self.header[KERNEL_CALLS] = kernel_calls
            self._write_header()
            os.fsync(self.fd)
        except OSError as exc:
            raise _disk_error(self.path, exc) from None

    def sync(self) -> None:
        """Put this process's writes on disk: on a folder shared between nodes, the other
        ranks read them next."""
        try:
            os.fsync(self.fd)
        except OSError as exc:
            raise _disk_error(self.path, exc) from None

    def share(self) -> SharedFile:
        """What other ranks open (read-only) once B is finished."""
        return SharedFile(str(self.path), self.header[TOKEN])

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None
        if self.owner:
            self.path.unlink(missing_ok=True)


def _read_header(fd: int) -> dict | None:
    try:
        header = json.loads(os.pread(fd, HEADER_BYTES, 0).rstrip(b" ").decode())
    except (OSError, ValueError):
        return None
    return header if isinstance(header, dict) and header.get("format") == FORMAT else None


def open_store(naux: int, ncols: int, path: Path | None):
    """B in the scratch file ``path``, or in memory when there is none; either reads as zero
    where it was not written."""
    if path is not None:
        return ScratchB.create(path, naux, ncols)
    return InMemoryB(naux, ncols)
