"""Tensors and tiles: numpy-backed storage plus views produced by slicing.

A :class:`Tensor` is a numpy basic-slicing view (never a copy) of one allocation's arrays.
On-chip storage (SBUF and PSUM) also carries a boolean "written" mask: reading an element nobody
wrote is undefined (the NKI language guide: ``ndarray`` does not initialise memory), so such
reads are rejected, and ``accumulate=None`` matmuls tell a first write from a later one. PSUM
also carries a "matmul_written" mask: a matmul may accumulate only onto elements that the
Tensor Engine wrote last (nc_matmul notes: accumulating onto PSUM value-initialised by memset or
tensor_copy is undefined on NeuronCore-v2/v3).
"""

from __future__ import annotations

import math

import numpy as np

from kernels.trn1 import (PARTITIONS, PSUM_BANK_BYTES, PSUM_BYTES_PER_PARTITION,
                          SBUF_BYTES_PER_PARTITION)

from . import buffers as _buffers
from .buffers import Buffer
from .dtypes import DType
from .errors import NKIRuleError, not_in_subset, shape_str
from .loops import LoopValue, concrete
from .state import current


class DynSlice:
    """``nl.ds(start, size)``: the index range ``start .. start + size``."""

    __slots__ = ("start", "size")

    def __init__(self, start: int | LoopValue, size: int) -> None:
        # start may be a dynamic_range index (a runtime offset); the size is a trace-time int.
        self.start = start if isinstance(start, LoopValue) else int(start)
        self.size = int(size)

    def __repr__(self) -> str:
        return f"nl.ds({self.start}, {self.size})"


class Storage:
    """Identity of one allocation: dtype, buffer, name, element count. Views of it share this
    object, so its lifetime (watched by the capacity tracker) is that of the last view."""

    __slots__ = ("dtype", "buffer", "name", "size", "is_input", "fully_written", "launch",
                 "partition_base", "__weakref__")

    def __init__(self, dtype: DType, buffer: Buffer, name: str, size: int,
                 is_input: bool = False) -> None:
        self.dtype = dtype
        self.buffer = buffer
        self.name = name
        self.size = size
        self.is_input = is_input
        self.launch = None
        """The launch (:class:`state.RunState`) an on-chip tile was allocated in: on-chip
        memory does not outlive it."""
        self.partition_base: int | None = None
        """The first partition of an on-chip tile placed with ``address=``; None where the
        compiler's allocator places it."""
        # Set once one write covered every element: reads then skip the written-mask check
        # (elements never become unwritten again).
        self.fully_written = False


class Tensor:
    """A tensor (HBM) or tile (SBUF / PSUM), or a slice of one. Dim 0 of a tile is partitions."""

    __slots__ = ("storage", "data", "written", "matmul_written", "shape", "dtype", "buffer",
                 "indexed", "partition_offset")

    def __init__(self, storage: Storage, data: np.ndarray, written: np.ndarray | None,
                 matmul_written: np.ndarray | None = None, indexed: bool = False,
                 partition_offset: int = 0) -> None:
        self.storage = storage
        self.data = data
        self.written = written  # None only for kernel inputs (written by the caller)
        self.matmul_written = matmul_written  # PSUM only: last written by the Tensor Engine
        self.shape: tuple[int, ...] = data.shape
        self.dtype: DType = storage.dtype
        self.buffer: Buffer = storage.buffer
        self.indexed = indexed  # produced by indexing: it may not be indexed again
        # first partition of this view within its allocation (on-chip views keep dim 0 a slice)
        self.partition_offset = partition_offset

    @property
    def ndim(self) -> int:
        """Number of dimensions."""
        return len(self.shape)

    @property
    def partitions(self) -> int:
        """Size of dim 0 (1 for a scalar view)."""
        return self.shape[0] if self.shape else 1

    @property
    def free_size(self) -> int:
        """Elements per partition: the product of dims 1.."""
        return math.prod(self.shape[1:])

    def __repr__(self) -> str:
        name = f" {self.storage.name!r}" if self.storage.name else ""
        return f"<{self.buffer!r} tensor{name} {shape_str(self.shape)} {self.dtype!r}>"

    def __getitem__(self, key: object) -> Tensor:
        if self.indexed:
            raise NKIRuleError(
                "nested-slice",
                f"indexing {self!r}, itself the result of indexing: NKI does not allow nested "
                "slicing (t[a:b][c:d]); index the tensor once with the combined ranges",
            )
        np_key = _normalize_key(key, self.shape, self.buffer.on_chip)
        data = self.data[np_key]
        if data.ndim == 0:
            raise NKIRuleError(
                "index-rank",
                f"indexing {shape_str(self.shape)} down to a scalar; use a slice of size 1",
            )
        written = None if self.written is None else self.written[np_key]
        by_matmul = None if self.matmul_written is None else self.matmul_written[np_key]
        first = np_key[0]
        offset = self.partition_offset + (first.start if isinstance(first, slice) else 0)
        return Tensor(self.storage, data, written, by_matmul, indexed=True,
                      partition_offset=offset)

    def __setitem__(self, key: object, value: object) -> None:
        raise NKIRuleError(
            "no-assign",
            f"item assignment into {self!r} is not part of the subset: write with "
            "nl.store / nisa.dma_copy (HBM) or an nisa instruction's dst= (on-chip)",
        )

    def _python_operator(self, *other: object) -> Tensor:
        raise not_in_subset(
            f"a Python arithmetic operator on {self!r} (t + t, t * 2.0, -t, ...); call nl.add / "
            "nl.multiply / nisa.tensor_tensor / nisa.tensor_scalar")

    __add__ = __radd__ = __sub__ = __rsub__ = __mul__ = __rmul__ = _python_operator
    __truediv__ = __rtruediv__ = __floordiv__ = __rfloordiv__ = _python_operator
    __mod__ = __rmod__ = __pow__ = __rpow__ = __matmul__ = __rmatmul__ = _python_operator
    __neg__ = __pos__ = __abs__ = _python_operator

    def reshape(self, *shape: object) -> Tensor:
        """Reshape an HBM tensor (contiguous), or an on-chip tile keeping its partition dim."""
        if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
            shape = tuple(shape[0])
        new_shape = check_shape(shape)
        if math.prod(new_shape) != math.prod(self.shape):
            raise NKIRuleError(
                "reshape", f"cannot reshape {shape_str(self.shape)} to {shape_str(new_shape)}")
        if self.buffer.on_chip and new_shape[0] != self.shape[0]:
            raise NKIRuleError(
                "partition-reshape",
                f"reshaping tile {shape_str(self.shape)} to {shape_str(new_shape)} moves data "
                "across partitions (dim 0 must stay the same)",
            )
        data = self.data.reshape(new_shape)
        if not np.may_share_memory(data, self.data):
            raise NKIRuleError(
                "reshape",
                f"reshape of non-contiguous view {shape_str(self.shape)} to "
                f"{shape_str(new_shape)} is not a view",
            )
        written = None if self.written is None else self.written.reshape(new_shape)
        by_matmul = None if self.matmul_written is None else self.matmul_written.reshape(new_shape)
        return Tensor(self.storage, data, written, by_matmul, self.indexed, self.partition_offset)


def check_shape(shape: object) -> tuple[int, ...]:
    """Validate a shape: a non-empty tuple of positive ints."""
    if isinstance(shape, (int, np.integer)):
        shape = (shape,)
    if not isinstance(shape, (tuple, list)) or not shape:
        raise NKIRuleError("shape", f"shape must be a non-empty tuple of ints, got {shape!r}")
    dims = []
    for d in shape:
        if isinstance(d, bool) or not isinstance(d, (int, np.integer)) or d <= 0:
            raise NKIRuleError("shape", f"shape must hold positive ints, got {tuple(shape)!r}")
        dims.append(int(d))
    return tuple(dims)


def allocate(shape: object, dtype: DType, buffer: Buffer, name: str = "",
             fill: float | int | None = None) -> Tensor:
    """Allocate a new tensor; unfilled memory holds NaN (float) or 4 (int) like the simulator,
    and on chip it is marked never-written so that reading it is an error."""
    shape = check_shape(shape)
    storage = Storage(dtype, buffer, name, math.prod(shape))
    storage.fully_written = fill is not None
    if buffer.on_chip:
        if shape[0] > PARTITIONS:
            raise NKIRuleError(
                "partition-limit",
                f"{buffer!r} tile {shape_str(shape)} has {shape[0]} partitions "
                f"(dim 0); the limit is {PARTITIONS}",
            )
        nbytes = math.prod(shape[1:]) * dtype.itemsize
        storage.launch = current()
        memory = storage.launch.memory
        if buffer is _buffers.psum:
            memory.acquire_psum(storage, shape, nbytes)
        else:
            memory.acquire_sbuf(storage, shape, nbytes)
    else:
        # HBM tensors too exist only inside a kernel launch; an HBM allocation is also a point
        # after which the latest on-chip allocation's capacity check is due.
        current().memory.verify()
    value = dtype.fill_value() if fill is None else dtype.convert(np.asarray(fill))
    data = np.full(shape, value, dtype=dtype.storage)
    # Every allocation tracks which elements were written (HBM too: a load of never-written
    # scratch, or an output returned half-filled, is refused); kernel inputs are not tracked.
    written = np.full(shape, fill is not None, dtype=bool)
    by_matmul = np.zeros(shape, dtype=bool) if buffer is _buffers.psum else None
    return Tensor(storage, data, written, by_matmul)


def check_address(t: Tensor, address: object) -> None:
    """Reject a placement that is malformed or runs past the partitions or the partition bytes.

    The unit of the free offset is not documented; bytes is the smaller reading, so a tile
    rejected here overflows under either reading."""
    shape = shape_str(t.shape)
    if not t.buffer.on_chip:
        raise NKIRuleError("address",
                           f"address= places SBUF/PSUM tiles; {shape} is in {t.buffer!r}")
    if (not isinstance(address, tuple) or len(address) != 2
            or not all(isinstance(a, (int, np.integer)) and not isinstance(a, bool) and a >= 0
                       for a in address)):
        raise NKIRuleError(
            "address", f"address of tile {shape} must be (partition_offset, free_offset) with "
            f"non-negative ints, got {address!r}")
    partition_offset, free_offset = (int(a) for a in address)
    capacity = (PSUM_BYTES_PER_PARTITION if t.buffer is _buffers.psum
                else SBUF_BYTES_PER_PARTITION)
    tile_bytes = t.free_size * t.dtype.itemsize
    if partition_offset + t.partitions > PARTITIONS or free_offset + tile_bytes > capacity:
        raise NKIRuleError(
            "address",
            f"tile {shape} at address {address!r} runs past the {t.buffer!r} partitions "
            f"({PARTITIONS}) or partition bytes ({capacity})",
        )
    # The byte spans of the tile under both readings of the free offset (bytes, elements):
    # a tile is refused only where it breaks a rule under either.
    spans = [(start, start + tile_bytes)
             for start in (free_offset, free_offset * t.dtype.itemsize)]
    if t.buffer is _buffers.psum and all(
            lo // PSUM_BANK_BYTES != (hi - 1) // PSUM_BANK_BYTES for lo, hi in spans):
        raise NKIRuleError(
            "psum-bank",
            f"PSUM tile {shape} at address {address!r} spans two banks; a matmul writes one "
            f"bank of {PSUM_BANK_BYTES} B per partition")
    current().memory.place(t.storage, t.buffer, (partition_offset,
                                                 partition_offset + t.partitions), spans)
    t.storage.partition_base = partition_offset


def wrap_input(array: np.ndarray, dtype: DType, name: str) -> Tensor:
    """A kernel input: a copy of ``array`` as an HBM tensor (the caller's array is not mutated)."""
    data = np.array(array, dtype=dtype.storage, copy=True)
    if dtype.rounder is not None:
        data = dtype.convert(data)
    storage = Storage(dtype, _buffers.shared_hbm, name, data.size, is_input=True)
    return Tensor(storage, data, None)


def _progression_slice(index: np.ndarray, axis: int, shape: tuple[int, ...]) -> slice:
    """Turn an integer index vector (an increasing affine range) into the equivalent slice."""
    flat = np.asarray(index).reshape(-1)
    if flat.dtype.kind not in "iu" or flat.size == 0:
        raise NKIRuleError("index-pattern", f"index array on axis {axis} must be integers")
    start = int(flat[0])
    step = int(flat[1] - flat[0]) if flat.size > 1 else 1
    if step <= 0 or (flat.size > 1 and np.any(np.diff(flat) != step)):
        raise NKIRuleError(
            "index-pattern",
            f"index array on axis {axis} of {shape_str(shape)} is not an increasing affine range",
        )
    return slice(start, start + step * (flat.size - 1) + 1, step)


def _normalize_key(key: object, shape: tuple[int, ...], on_chip: bool) -> tuple:
    """Validate an index and turn it into a numpy basic-slicing key (views only)."""
    if not isinstance(key, tuple):
        key = (key,)
    if any(k is Ellipsis for k in key):
        at = key.index(Ellipsis)
        key = key[:at] + (slice(None),) * (len(shape) - len(key) + 1) + key[at + 1:]
    if len(key) > len(shape):
        raise NKIRuleError("index-rank",
                           f"{len(key)} indices for tensor of shape {shape_str(shape)}")
    out = []
    for axis, k in enumerate(key):
        n = shape[axis]
        k = concrete(k)  # a dynamic_range index: its value in the iteration being executed
        if isinstance(k, DynSlice):
            start = concrete(k.start)
            k = slice(start, start + k.size)
        elif isinstance(k, np.ndarray):
            k = _progression_slice(k, axis, shape)
        if isinstance(k, slice):
            start = 0 if k.start is None else int(concrete(k.start))
            stop = n if k.stop is None else int(concrete(k.stop))
            step = 1 if k.step is None else int(k.step)
            if not 0 <= start < stop <= n or step <= 0:
                raise NKIRuleError(
                    "index-bounds",
                    f"slice {start}:{stop}:{step} on axis {axis} is empty or outside tensor of "
                    f"shape {shape_str(shape)}",
                )
            if step != 1 and axis == 0 and on_chip:
                raise NKIRuleError(
                    "partition-step",
                    f"step {step} along the partition dim of tile {shape_str(shape)} is illegal",
                )
            out.append(slice(start, stop, step))
        elif isinstance(k, (int, np.integer)) and not isinstance(k, bool):
            i = int(k)
            if not 0 <= i < n:
                raise NKIRuleError(
                    "index-bounds",
                    f"index {i} on axis {axis} outside tensor of shape {shape_str(shape)}")
            # An integer partition index keeps a partition dim of size 1 on chip.
            out.append(slice(i, i + 1) if (axis == 0 and on_chip) else i)
        else:
            raise NKIRuleError("index-type", f"unsupported index {k!r} on axis {axis}")
    out.append(Ellipsis)  # keeps an all-integer key a (0-d) view instead of a numpy scalar
    return tuple(out)
