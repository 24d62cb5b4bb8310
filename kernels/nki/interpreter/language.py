"""Stand-in for ``nki.language``: dtypes, buffers, allocation, DMA, loops and nl.* helpers."""

from __future__ import annotations

import numpy as np

from kernels.trn1 import FP32_BYTES, MATMUL_M_MAX, MATMUL_N_MAX, PARTITIONS, PSUM_BANK_BYTES

from . import convenience as _conv
from . import ops as _ops
from .buffers import check_buffer as _check_buffer
from .buffers import hbm, private_hbm, psum, sbuf, shared_hbm
from .dma import load, load_transpose2d, store
from .dtypes import (bfloat16, bool_, float8_e4m3, float8_e5m2, float16, float32, int8, int16,
                     int32, resolve as _resolve, tfloat32, uint8, uint16, uint32)
from .errors import NKIRuleError, not_in_subset
from .loops import dynamic_range
from .ops import Op
from .state import current as _current
from .tensor import DynSlice, Tensor, allocate as _allocate, check_address as _check_address

__all__ = [
    "sbuf", "psum", "shared_hbm", "hbm", "private_hbm",
    "float32", "tfloat32", "bfloat16", "float16", "float8_e4m3", "float8_e5m2",
    "int8", "int16", "int32", "uint8", "uint16", "uint32", "bool_",
    "ndarray", "zeros", "ones", "full", "zeros_like", "load", "load_transpose2d", "store",
    "ds", "arange", "static_range", "affine_range", "sequential_range", "dynamic_range",
    "tile_size", "add", "subtract", "multiply", "divide", "maximum", "minimum", "power", "equal",
    "max", "min", "sum", "copy", "exp", "log", "square", "sqrt", "rsqrt", "reciprocal", "abs",
    "tanh", "relu", "sigmoid", "broadcast_to", "transpose", "matmul",
]


# Named by the 0.3.0 nki.language.tile_size page without a value: the usable SBUF bytes per
# partition (192 KiB less a reserve) and the byte alignment of SBUF / PSUM free offsets.
_UNPUBLISHED_TILE_SIZES = ("total_available_sbuf_size", "sbuf_min_align", "psum_min_align")


class _TileSizeNames(type):
    """``nl.tile_size.<name>`` outside the modelled four: a rule error naming it."""

    def __getattr__(cls, name: str) -> object:
        if name.startswith("_"):
            raise AttributeError(name)
        unpublished = name in _UNPUBLISHED_TILE_SIZES
        raise not_in_subset(
            f"nl.tile_size.{name}"
            + (" (the NKI 0.3.0 reference names it but publishes no value for trn1)"
               if unpublished else ""))


class tile_size(metaclass=_TileSizeNames):
    """Hardware tile limits as plain Python ints."""

    pmax = PARTITIONS  # partitions of SBUF / PSUM
    psum_fmax = PSUM_BANK_BYTES // FP32_BYTES  # fp32 elements per partition in one PSUM bank
    gemm_stationary_fmax = MATMUL_M_MAX  # M limit of nc_matmul
    gemm_moving_fmax = MATMUL_N_MAX  # N limit of nc_matmul


def ndarray(shape, dtype, buffer=sbuf, name="", address=None) -> Tensor:
    """Allocate an uninitialised tensor (NaN for floats, 4 for ints, like the simulator).

    ``address=(partition_offset, free_offset)`` places an on-chip tile explicitly (NKI 0.3.0);
    the interpreter models no allocator, so it only checks that the tile fits its buffer there
    and starts the tile's compute-engine accesses from that partition."""
    t = _allocate(shape, _resolve(dtype), _check_buffer(buffer, shape), name)
    if address is not None:
        _check_address(t, address)
    return t


def _initialised(shape, dtype, buffer, name, value) -> Tensor:
    t = _allocate(shape, _resolve(dtype), _check_buffer(buffer, shape), name, fill=value)
    profile = _current().profile
    if t.buffer.on_chip:
        # a memset: the compiler puts it on GpSimd, or on Vector for PSUM (GpSimd cannot reach it)
        profile.record_elementwise("vector" if t.buffer is psum else "gpsimd", t.partitions,
                                   t.free_size)
    else:
        profile.record_dma(t.data.size, t.data.size * t.dtype.itemsize)
    return t


def zeros(shape, dtype, buffer=sbuf, name="") -> Tensor:
    """Allocate a tensor filled with 0."""
    return _initialised(shape, dtype, buffer, name, 0)


def ones(shape, dtype, buffer=sbuf, name="") -> Tensor:
    """Allocate a tensor filled with 1."""
    return _initialised(shape, dtype, buffer, name, 1)


def full(shape, fill_value, dtype, buffer=sbuf, name="") -> Tensor:
    """Allocate a tensor filled with ``fill_value``."""
    return _initialised(shape, dtype, buffer, name, fill_value)


def zeros_like(a, dtype=None, buffer=None, name="") -> Tensor:
    """Zeros with the shape (and by default dtype and buffer) of ``a``."""
    return zeros(a.shape, a.dtype if dtype is None else dtype,
                 a.buffer if buffer is None else buffer, name)


def ds(start, size) -> DynSlice:
    """Index range ``start .. start + size`` (usable in every dimension)."""
    return DynSlice(start, size)


def arange(*args) -> None:
    """Not in NKI 0.3.0 (absent from its nki.language reference; the Beta 1 ``t[i_p, i_f]``
    index style went with it): a rule violation rather than an AttributeError."""
    raise NKIRuleError(
        "nl-arange",
        f"nl.arange({', '.join(repr(a) for a in args)}) is not part of NKI 0.3.0's "
        "nki.language; index with slices (t[0:128, 0:512]) or nl.ds(start, size)",
    )


def static_range(*args) -> range:
    """Loop unrolled at trace time."""
    return range(*args)


affine_range = static_range
sequential_range = static_range
# dynamic_range (a device loop whose index is a runtime value) comes from .loops.


def sum(x, axis, dtype=None, keepdims=False) -> Tensor:  # noqa: A001 - the nl.sum name
    """Sum over free axes (the partition axis 0 is forbidden) into a new tile."""
    return _conv.reduce(add, x, axis, dtype, keepdims)


add = Op("add", _conv.binary, binary=np.add, reduce=np.sum, numpy_alias=np.add)
subtract = Op("subtract", _conv.binary, binary=np.subtract, reduce=_ops.subtract_fold,
              numpy_alias=np.subtract)
multiply = Op("multiply", _conv.binary, binary=np.multiply, reduce=np.prod, numpy_alias=np.multiply)
divide = Op("divide", _conv.binary, binary=np.divide, numpy_alias=np.divide)
maximum = Op("maximum", _conv.binary, binary=np.maximum, reduce=np.max, numpy_alias=np.maximum)
minimum = Op("minimum", _conv.binary, binary=np.minimum, reduce=np.min, numpy_alias=np.minimum)
power = Op("power", _conv.binary, binary=np.power, numpy_alias=np.power)
equal = Op("equal", _conv.binary, binary=_ops.equal, numpy_alias=np.equal)
max = Op("max", _conv.reduce, reduce=np.max, numpy_alias=np.max)
min = Op("min", _conv.reduce, reduce=np.min, numpy_alias=np.min)
copy = Op("copy", _conv.copy, unary=_ops.identity)
reciprocal = Op("reciprocal", _conv.reciprocal, unary=_ops.reciprocal, numpy_alias=np.reciprocal)
exp = Op("exp", _conv.activation, unary=np.exp, numpy_alias=np.exp)
log = Op("log", _conv.activation, unary=np.log, numpy_alias=np.log)
square = Op("square", _conv.activation, unary=np.square, numpy_alias=np.square)
sqrt = Op("sqrt", _conv.activation, unary=np.sqrt, numpy_alias=np.sqrt)
rsqrt = Op("rsqrt", _conv.activation, unary=_ops.rsqrt)
abs = Op("abs", _conv.activation, unary=np.abs, numpy_alias=np.abs)
tanh = Op("tanh", _conv.activation, unary=np.tanh, numpy_alias=np.tanh)
relu = Op("relu", _conv.activation, unary=_ops.relu)
sigmoid = Op("sigmoid", _conv.activation, unary=_ops.sigmoid)

broadcast_to = _conv.broadcast_to
transpose = _conv.transpose
matmul = _conv.matmul


def __getattr__(name: str) -> object:
    """``nl.<name>`` outside the subset: a rule error naming it, not an AttributeError."""
    if name.startswith("_"):
        raise AttributeError(name)
    raise not_in_subset(f"nl.{name}")
