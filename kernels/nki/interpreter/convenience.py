"""The experimental ``nl.*`` compute helpers, built on the ``nisa`` instructions.

Each returns a new tile (SBUF; PSUM for ``nl.matmul`` / ``nl.transpose``, and ``nl.copy`` of a
PSUM tile, as in the NKI 0.3.0 nki.language reference).
Binary helpers do not broadcast tiles: shapes must match exactly (``nl.broadcast_to`` first).
"""

from __future__ import annotations

import numpy as np

from . import buffers as _buffers
from . import isa
from .dtypes import DType, float32, resolve
from .errors import NKIRuleError, shape_str
from .ops import Op
from .operands import on_chip, read, read_f32, write
from .state import current
from .tensor import Tensor, allocate, check_shape


def _result_dtype(dtype: object, *tiles: Tensor) -> DType:
    if dtype is not None:
        return resolve(dtype)
    first = tiles[0].dtype
    return first if all(t.dtype is first for t in tiles) else float32


def binary(op: Op, x, y, dtype=None) -> Tensor:
    """``nl.add(x, y)`` and friends: tile-tile (same shape) or tile-scalar elementwise."""
    x_tile, y_tile = isinstance(x, Tensor), isinstance(y, Tensor)
    if not (x_tile or y_tile):
        raise NKIRuleError("operand-type", f"nl.{op.name} needs at least one tile operand")
    if x_tile and y_tile:
        x, y = on_chip(x, "x"), on_chip(y, "y")
        if x.shape != y.shape:
            raise NKIRuleError(
                "unbroadcast",
                f"nl.{op.name} of tiles {shape_str(x.shape)} and {shape_str(y.shape)}: binary ops "
                "do not broadcast, call nl.broadcast_to first",
            )
        out = allocate(x.shape, _result_dtype(dtype, x, y), _buffers.sbuf)
        isa.tensor_tensor(dst=out, data1=x, data2=y, op=op)
        return out
    tile, scalar, reverse = (x, y, False) if x_tile else (y, x, True)
    tile = on_chip(tile, "x" if x_tile else "y")
    out = allocate(tile.shape, _result_dtype(dtype, tile), _buffers.sbuf)
    isa.tensor_scalar(dst=out, data=tile, op0=op, operand0=scalar, reverse0=reverse)
    return out


def activation(op: Op, x, dtype=None) -> Tensor:
    """``nl.exp(x)`` and friends: one Scalar Engine activation into a new tile."""
    x = on_chip(x, "x")
    out = allocate(x.shape, _result_dtype(dtype, x), _buffers.sbuf)
    isa.activation(dst=out, op=op, data=x)
    return out


def copy(op: Op, x, dtype=None) -> Tensor:
    """``nl.copy(x)``: a new tile in x's buffer (SBUF or PSUM), written by one Scalar Engine
    ``activation(op=nl.copy)``, as the NKI 0.3.0 nki.language.copy reference describes."""
    x = on_chip(x, "x")
    out = allocate(x.shape, _result_dtype(dtype, x), x.buffer)
    isa.activation(dst=out, op=op, data=x)
    return out


def reciprocal(op: Op, x, dtype=None) -> Tensor:
    """``nl.reciprocal(x)``: Vector Engine 1/x into a new tile."""
    x = on_chip(x, "x")
    out = allocate(x.shape, _result_dtype(dtype, x), _buffers.sbuf)
    isa.reciprocal(dst=out, data=x)
    return out


def reduce(op: Op, x, axis, dtype=None, keepdims=False) -> Tensor:
    """``nl.sum`` / ``nl.max`` / ``nl.min`` over free axes into a new tile."""
    x = on_chip(x, "x")
    axes = isa.reduce_axes(axis, x.shape)
    if keepdims:
        shape = tuple(1 if i in axes else d for i, d in enumerate(x.shape))
    else:
        shape = tuple(d for i, d in enumerate(x.shape) if i not in axes)
    out = allocate(shape, _result_dtype(dtype, x), _buffers.sbuf)
    isa.tensor_reduce(dst=out, op=op, data=x, axis=axes, keepdims=keepdims)
    return out


def broadcast_to(x, shape, dtype=None) -> Tensor:
    """Copy ``x`` broadcast (size-1 dims stretched, including partitions) into a new tile, cast
    to ``dtype`` (through fp32) when given; ``x`` itself when it has the shape and the dtype
    already (the nki.language.broadcast_to reference: "returns x unchanged")."""
    x = on_chip(x, "x")
    shape = check_shape(shape)
    if len(shape) != x.ndim or any(s != d and s != 1 for s, d in zip(x.shape, shape)):
        raise NKIRuleError("broadcast-shape",
                           f"cannot broadcast {shape_str(x.shape)} to {shape_str(shape)}")
    out_dtype = x.dtype if dtype is None else resolve(dtype)
    if shape == x.shape and out_dtype is x.dtype:
        return x
    out = allocate(shape, out_dtype, _buffers.sbuf)
    values = read(x, "x") if out_dtype is x.dtype else read_f32(x, "x")
    write(out, np.broadcast_to(values, shape))
    current().profile.record_elementwise("vector", out.partitions, out.free_size)
    return out


def transpose(x, dtype=None) -> Tensor:
    """Tensor Engine transpose of a 2-D SBUF tile into a new PSUM tile; with a ``dtype`` of
    its own (the nki.language.transpose reference casts the output) nc_transpose keeps x's
    dtype, as it must, and a Vector Engine copy in PSUM casts."""
    x = on_chip(x, "x")
    isa.check_transpose_limit(x, "tensor")
    out = allocate((x.free_size, x.partitions), x.dtype, _buffers.psum)
    isa.nc_transpose(dst=out, data=x)
    if dtype is None or resolve(dtype) is x.dtype:
        return out
    cast = allocate(out.shape, resolve(dtype), _buffers.psum)
    isa.tensor_copy(dst=cast, src=out)
    return cast


def matmul(x, y, transpose_x=False) -> Tensor:
    """``x @ y`` (or ``x.T @ y`` with ``transpose_x=True``) into a new fp32 PSUM tile.

    The Tensor Engine contracts over partitions, so without ``transpose_x`` x [M, K] is first
    transposed (Tensor Engine into PSUM, then Vector Engine copy to SBUF), as the NKI 0.3.0
    nki.language.matmul reference says: "an additional transpose will be inserted"."""
    x = on_chip(x, "x")
    y = on_chip(y, "y")
    stationary = x if transpose_x else _transposed_in_sbuf(x)
    _, m, n = isa.matmul_dims(stationary, y)
    out = allocate((m, n), float32, _buffers.psum)
    isa.nc_matmul(dst=out, stationary=stationary, moving=y, accumulate=False)
    return out


def _transposed_in_sbuf(x: Tensor) -> Tensor:
    """x [P, F] as a new SBUF tile [F, P]: the stationary layout of nc_matmul."""
    isa.check_transpose_limit(x, "tensor")
    in_psum = allocate((x.free_size, x.partitions), x.dtype, _buffers.psum)
    isa.nc_transpose(dst=in_psum, data=x)
    in_sbuf = allocate(in_psum.shape, x.dtype, _buffers.sbuf)
    isa.tensor_copy(dst=in_sbuf, src=in_psum)
    return in_sbuf
