"""Stand-in for ``nki.isa``: the instructions of the NKI 0.3.0 subset (destination-passing
style)."""

from __future__ import annotations

import enum

import numpy as np

from kernels.trn1 import (MATMUL_K_MAX, MATMUL_M_MAX, MATMUL_N_MAX, NEURON_CORE_VERSION,
                          PE_TRANSPOSE_MAX, VECTOR_TRANSPOSE_MAX)

from . import buffers as _buffers
from .dma import dma_copy, dge_mode, oob_mode
from .dtypes import FP32_CLASS, float32
from .errors import NKIRuleError, not_in_subset, shape_str
from .ops import Op, canonical
from .operands import (in_buffer, integer_fill, matmul_operand_at_row_zero, on_chip, read,
                       read_f32, same_layout, same_partitions, scalar_f32, vector_operand, write)
from .state import current

__all__ = [
    "engine", "reduce_cmd", "dge_mode", "oob_mode", "nc_matmul", "nc_transpose", "tensor_copy",
    "tensor_tensor", "tensor_scalar", "activation", "reciprocal", "tensor_reduce", "memset",
    "dma_copy",
]


class engine(enum.Enum):
    """Engine selector of instructions that can run on several engines."""

    unknown = "unknown"
    tensor = "tensor"
    vector = "vector"
    scalar = "scalar"
    gpsimd = "gpsimd"


class reduce_cmd(enum.Enum):
    """Scalar Engine reduction register command (only ``idle`` is supported here)."""

    idle = "idle"
    reset = "reset"
    reduce = "reduce"
    reset_reduce = "reset_reduce"


_REDUCE_IDLE = reduce_cmd.idle
# A Tensor Engine transpose is exact for NaN / Inf inputs from NeuronCore-v3 on (nki.isa
# nc_transpose); on v2 it is a matmul against an identity, where 0 * Inf spreads NaN.
_EXACT_PE_TRANSPOSE_MIN_CORE_VERSION = 3


def _engine_name(selected: object, default: str, allowed: tuple[str, ...],
                 rule: str = "unsupported", instruction: str = "this instruction") -> str:
    """The engine an instruction runs on: ``selected``, or ``default`` for ``engine.unknown``
    (the compiler's choice); an engine outside ``allowed`` breaks ``rule``."""
    if not isinstance(selected, engine):
        raise NKIRuleError("raw-enum", f"engine must be an nisa.engine member, got {selected!r}")
    name = default if selected is engine.unknown else selected.value
    if name not in allowed:
        raise NKIRuleError(
            rule,
            f"{instruction} cannot run on the {name} engine (supported: {', '.join(allowed)})")
    return name


def _gpsimd_keeps_off_psum(where: str, instruction: str, **tiles) -> None:
    """The GpSimd engine cannot access PSUM (nki.isa tensor_copy / tensor_tensor notes)."""
    if where != "gpsimd":
        return
    for what, tile in tiles.items():
        if tile.buffer is _buffers.psum:
            raise NKIRuleError(
                "gpsimd-psum",
                f"{instruction} runs on the GpSimd engine, which cannot access PSUM, but {what} "
                f"{shape_str(tile.shape)} is a PSUM tile",
            )


def _op(op: object, role: str, what: str = "op") -> Op:
    op = canonical(op)
    if not isinstance(op, Op) or getattr(op, role) is None:
        raise NKIRuleError("unsupported-op", f"{what}={op!r} is not a supported {role} operator")
    return op


def _unsupported(**options: object) -> None:
    for name, value in options.items():
        if value:
            raise NKIRuleError("unsupported",
                               f"{name}={value!r} is not supported by the interpreter")


def matmul_dims(stationary, moving) -> tuple[int, int, int]:
    """(K, M, N) of a Tensor Engine matmul, checking the contraction dim and the limits."""
    k, m, n = stationary.partitions, stationary.free_size, moving.free_size
    shapes = f"stationary {shape_str(stationary.shape)}, moving {shape_str(moving.shape)}"
    if moving.partitions != k:
        raise NKIRuleError("matmul-shape", f"contraction (partition) dims differ: {shapes}")
    for label, size, limit in (("K", k, MATMUL_K_MAX), ("M", m, MATMUL_M_MAX),
                               ("N", n, MATMUL_N_MAX)):
        if size > limit:
            raise NKIRuleError("matmul-limit", f"{label}={size} exceeds {limit}: {shapes}")
    return k, m, n


def check_transpose_limit(data, where: str) -> None:
    """Tensor Engine transposes up to 128x128, Vector Engine up to 32x32."""
    limit = PE_TRANSPOSE_MAX if where == "tensor" else VECTOR_TRANSPOSE_MAX
    if data.partitions > limit or data.free_size > limit:
        raise NKIRuleError(
            "transpose-limit",
            f"{where} engine transposes at most {limit}x{limit}; data is {shape_str(data.shape)}")


def nc_matmul(dst, stationary, moving, is_stationary_onezero=False, is_moving_onezero=False,
              is_transpose=False, accumulate=None, tile_position=(), tile_size=(),
              perf_mode=None, name=None) -> None:
    """dst[M, N] (PSUM, fp32) (+)= stationary[K, M]^T @ moving[K, N] on the Tensor Engine."""
    _unsupported(is_transpose=is_transpose, tile_position=tile_position, tile_size=tile_size,
                 perf_mode=perf_mode)
    dst = on_chip(dst, "dst")
    stationary = on_chip(stationary, "stationary")
    moving = on_chip(moving, "moving")
    in_buffer(stationary, _buffers.sbuf, "matmul-buffer", "stationary")
    in_buffer(moving, _buffers.sbuf, "matmul-buffer", "moving")
    matmul_operand_at_row_zero(stationary, "stationary")
    matmul_operand_at_row_zero(moving, "moving")
    in_buffer(dst, _buffers.psum, "matmul-buffer", "dst")
    k, m, n = matmul_dims(stationary, moving)
    shapes = (f"stationary {shape_str(stationary.shape)}, moving {shape_str(moving.shape)}, "
              f"dst {shape_str(dst.shape)}")
    if dst.partitions != m or dst.free_size != n:
        raise NKIRuleError("matmul-shape", f"dst must be ({m}, {n}): {shapes}")
    in_fp32 = (stationary.dtype in FP32_CLASS, moving.dtype in FP32_CLASS)
    if not (stationary.dtype.is_float and moving.dtype.is_float) or in_fp32[0] != in_fp32[1]:
        raise NKIRuleError(
            "matmul-dtype",
            f"inputs {stationary.dtype!r} and {moving.dtype!r} ({shapes}): both must be float, "
            "and fp32/tf32 cannot be mixed with narrower types",
        )
    if dst.dtype is not float32:
        raise NKIRuleError("matmul-dtype", f"dst must be float32, not {dst.dtype!r} ({shapes})")
    if accumulate not in (None, True, False):
        raise NKIRuleError("operand-type",
                           f"accumulate must be None, True or False, got {accumulate!r}")
    accumulate = None if accumulate is None else bool(accumulate)
    product = (read_f32(stationary, "stationary").reshape(k, m).T
               @ read_f32(moving, "moving").reshape(k, n))
    if accumulate is False or (accumulate is None and not dst.written.any()):
        write(dst, product, by_tensor_engine=True)
    elif dst.matmul_written.all():
        dst.data[...] += product.reshape(dst.shape)
    else:
        _accumulate_partially(dst, product.reshape(dst.shape), accumulate)
    current().profile.record_matmul(k, m, n, low_precision=stationary.dtype is not float32)


def _accumulate_partially(dst, product: np.ndarray, accumulate: bool | None) -> None:
    """A matmul adding onto a PSUM tile that not only matmuls wrote: ``True`` needs every element
    matmul-written; ``None`` adds where anything wrote and overwrites the rest. Adding onto what
    another instruction (memset, tensor_copy, ...) wrote is undefined on NeuronCore-v2/v3."""
    written = dst.written
    if accumulate and not written.all():
        raise NKIRuleError(
            "psum-uninitialized",
            f"accumulate=True into PSUM tile {shape_str(dst.shape)} with never-written elements",
        )
    if (written & ~dst.matmul_written).any():
        raise NKIRuleError(
            "psum-accumulate-init",
            f"nc_matmul (accumulate={accumulate}) would add onto PSUM tile {shape_str(dst.shape)} "
            "where a non-matmul instruction (memset, tensor_copy, ...) wrote the values: undefined "
            "on NeuronCore-v2/v3; start the accumulation with accumulate=False",
        )
    write(dst, np.where(written, dst.data + product, product), by_tensor_engine=True)


def nc_transpose(dst, data, engine=engine.unknown, name=None) -> None:
    """dst[F, P] = data[P, F]^T: Tensor Engine (SBUF -> PSUM, <= 128x128) or Vector (<= 32x32)."""
    dst = on_chip(dst, "dst")
    data = on_chip(data, "data")
    where = _engine_name(engine, "tensor", ("tensor", "vector"))
    p, f = data.partitions, data.free_size
    check_transpose_limit(data, where)
    if where == "tensor":
        in_buffer(data, _buffers.sbuf, "transpose-buffer", "data")
        in_buffer(dst, _buffers.psum, "transpose-buffer", "dst")
        matmul_operand_at_row_zero(data, "data")
    if dst.partitions != f or dst.free_size != p:
        raise NKIRuleError(
            "transpose-shape",
            f"dst {shape_str(dst.shape)} must be ({f}, {p}) for data {shape_str(data.shape)}")
    if dst.dtype is not data.dtype:
        raise NKIRuleError(
            "transpose-dtype",
            f"dst {shape_str(dst.shape)} {dst.dtype!r} must have the dtype of data {data.dtype!r}")
    # A transpose moves values (dst keeps data's dtype, and the reference calls it bit-accurate
    # except NaN / Inf on v2): no trip through fp32, which rounds int32 beyond 2^24.
    values = read(data, "data").reshape(p, f)
    if where == "tensor":
        _finite_for_pe_transpose(values, data)
    # A Tensor Engine transpose is a matmul against an identity: its PSUM output is matmul-written.
    write(dst, values.T, by_tensor_engine=where == "tensor")
    profile = current().profile
    if where == "tensor":
        profile.record_transpose(p, f, low_precision=data.dtype is not float32)
    else:
        profile.record_elementwise("vector", p, f)


def _finite_for_pe_transpose(values: np.ndarray, data) -> None:
    """Refuse NaN / Inf in a Tensor Engine transpose on NeuronCore-v2: the documents say its
    result is then not bit-accurate, so no exact transpose can stand for it."""
    if NEURON_CORE_VERSION >= _EXACT_PE_TRANSPOSE_MIN_CORE_VERSION or np.isfinite(values).all():
        return
    raise NKIRuleError(
        "transpose-nonfinite",
        f"Tensor Engine nc_transpose of data {shape_str(data.shape)} holding NaN or Inf: on "
        f"NeuronCore-v{NEURON_CORE_VERSION} (trn1) the transpose is a matmul against an "
        "identity and is not bit-accurate for such values; replace them first, or transpose on "
        "the Vector engine (up to 32x32)")


def tensor_copy(dst, src, engine=engine.unknown, name=None) -> None:
    """dst = src between SBUF/PSUM tiles, casting through fp32 with RNE."""
    dst = on_chip(dst, "dst")
    src = on_chip(src, "src")
    # NeuronCore-v2 (trn1) has no Scalar Engine tensor_copy (nki.isa.tensor_copy notes).
    where = _engine_name(engine, "vector", ("vector", "gpsimd"), "tensor-copy-engine",
                         f"tensor_copy of {shape_str(src.shape)} on trn1 (NeuronCore-v2; the "
                         "Scalar engine copies with nisa.activation(op=nl.copy))")
    _gpsimd_keeps_off_psum(where, "tensor_copy", dst=dst, src=src)
    same_layout(dst, src, "dst", "src")
    values = read(src, "src") if src.dtype is dst.dtype else read_f32(src, "src")
    write(dst, values)
    current().profile.record_elementwise(where, src.partitions, src.free_size)


_INT32_CLASS = ("int32", "uint32")


def _tensor_tensor_default_engine(op: Op, *tiles) -> str:
    """The engine ``engine.unknown`` gives (nki.isa.tensor_tensor notes): nl.power runs on GpSimd;
    all-int32/uint32 operands go to GpSimd unless a tile is in PSUM; the rest to Vector."""
    if op.name == "power":
        return "gpsimd"
    if _all_int32(*tiles) and not any(t.buffer is _buffers.psum for t in tiles):
        return "gpsimd"
    return "vector"


def _all_int32(*tiles) -> bool:
    return all(t.dtype.name in _INT32_CLASS for t in tiles)


def _exact_integer(op: Op, dst, data1, data2) -> np.ndarray:
    """op(data1, data2) in exact integer arithmetic: GpSimd's native int32/uint32 path (nki.isa
    tensor_tensor: "ensures exact results for all 32-bit integer values"). Computed on Python
    ints, so no intermediate wraps; whether the engine wraps or saturates a result outside the
    dst dtype is not documented, so such a result is refused rather than guessed."""
    a = read(data1, "data1").astype(object)
    b = read(data2, "data2").astype(object).reshape(a.shape)
    if op.name == "power" and (b < 0).any():
        raise NKIRuleError(
            "integer-overflow",
            f"tensor_tensor(op=nl.power) of int tiles {shape_str(data1.shape)} with a negative "
            "exponent has no integer result")
    result = np.asarray(op.binary(a, b), dtype=object)
    if op.name == "equal":
        result = result.astype(bool).astype(np.int64)
    low, high = dst.dtype.low, dst.dtype.high
    if ((result < low) | (result > high)).any():
        raise NKIRuleError(
            "integer-overflow",
            f"tensor_tensor(op={op!r}) on the GpSimd engine gives values outside {dst.dtype!r} "
            f"for dst {shape_str(dst.shape)}; the documents do not say whether native integer "
            "arithmetic wraps or saturates")
    return result.astype(np.int64)


def tensor_tensor(dst, data1, data2, op, engine=engine.unknown, name=None) -> None:
    """dst = op(data1, data2) elementwise: fp32 on the Vector Engine (and on GpSimd for float
    tiles), exact integers on GpSimd when every tile is int32/uint32."""
    dst = on_chip(dst, "dst")
    data1 = on_chip(data1, "data1")
    data2 = on_chip(data2, "data2")
    op = canonical(op)
    if isinstance(op, Op) and op.name == "divide":
        raise NKIRuleError(
            "tensor-divide",
            f"tensor-tensor divide of {shape_str(data1.shape)} by {shape_str(data2.shape)} is not "
            "supported in 0.3.0: multiply by nisa.reciprocal / nl.reciprocal instead",
        )
    op = _op(op, "binary")
    default = _tensor_tensor_default_engine(op, dst, data1, data2)
    allowed = ("gpsimd",) if op.name == "power" else ("vector", "gpsimd")
    where = _engine_name(engine, default, allowed, instruction=f"tensor_tensor with op={op!r}")
    _gpsimd_keeps_off_psum(where, f"tensor_tensor with op={op!r}", dst=dst, data1=data1,
                           data2=data2)
    if data1.buffer is _buffers.psum and data2.buffer is _buffers.psum:
        raise NKIRuleError(
            "psum-both",
            f"data1 {shape_str(data1.shape)} and data2 {shape_str(data2.shape)} are both in PSUM")
    same_layout(data1, data2, "data1", "data2")
    same_layout(dst, data1, "dst", "data1")
    if where == "gpsimd" and _all_int32(dst, data1, data2):
        write(dst, _exact_integer(op, dst, data1, data2))
    else:
        a = read_f32(data1, "data1")
        b = read_f32(data2, "data2")
        if b.shape != a.shape:
            b = b.reshape(a.shape)
        write(dst, op.binary(a, b))
    current().profile.record_elementwise(where, data1.partitions, data1.free_size)


def _gpsimd_scalar_ops_only_rsqrt(*ops: object) -> None:
    """On GpSimd, tensor_scalar takes only rsqrt (nki.isa.tensor_scalar, the engine parameter)."""
    for op in ops:
        if op is None:
            continue
        op = canonical(op)
        if not (isinstance(op, Op) and op.name == "rsqrt"):
            raise NKIRuleError(
                "tensor-scalar-engine",
                f"tensor_scalar with op={op!r} on the GpSimd engine: GpSimd runs tensor_scalar "
                "only for rsqrt; use the Vector engine (the default)",
            )


def _no_divide(op: object, what: str, data) -> None:
    """NKI 0.3.0 has no divide operator at all (docs/kernels.md FACTS Instructions: OPS lists
    none, the nki.language list has no divide): dividing by a scalar is refused like dividing
    by a tile."""
    op = canonical(op)
    if isinstance(op, Op) and op.name == "divide":
        raise NKIRuleError(
            "scalar-divide",
            f"tensor_scalar({what}=nl.divide) of {shape_str(data.shape)}: NKI 0.3.0 has no "
            "divide operator; multiply by the reciprocal (op=nl.multiply with 1/x, or "
            "nisa.reciprocal of a (P, 1) tile)",
        )


def _apply_scalar_op(values: np.ndarray, op: Op, operand, reverse: bool) -> np.ndarray:
    return op.binary(operand, values) if reverse else op.binary(values, operand)


def tensor_scalar(dst, data, op0, operand0, reverse0=False, op1=None, operand1=None,
                  reverse1=False, engine=engine.unknown, name=None) -> None:
    """dst = (data op0 operand0) op1 operand1; operands are scalars or (P, 1) fp32 tiles."""
    dst = on_chip(dst, "dst")
    data = on_chip(data, "data")
    where = _engine_name(engine, "vector", ("vector", "scalar", "gpsimd"))
    if where == "gpsimd":
        _gpsimd_scalar_ops_only_rsqrt(op0, op1)
    _gpsimd_keeps_off_psum(where, "tensor_scalar", dst=dst, data=data)
    _no_divide(op0, "op0", data)
    _no_divide(op1, "op1", data)
    same_layout(dst, data, "dst", "data")
    values = read_f32(data, "data")
    values = _apply_scalar_op(values, _op(op0, "binary", "op0"),
                              vector_operand(operand0, data, "operand0"), reverse0)
    if op1 is not None:
        if operand1 is None:
            raise NKIRuleError("operand-type", "op1 given without operand1")
        values = _apply_scalar_op(values, _op(op1, "binary", "op1"),
                                  vector_operand(operand1, data, "operand1"), reverse1)
    elif operand1 is not None:
        raise NKIRuleError("operand-type", "operand1 given without op1")
    write(dst, values)
    current().profile.record_elementwise(where, data.partitions, data.free_size)


def activation(dst, op, data, bias=None, scale=1.0, reduce_op=None, reduce_res=None,
               reduce_cmd=reduce_cmd.idle, name=None) -> None:
    """dst = op(data * scale + bias) on the Scalar Engine; bias is a (P, 1) fp32 tile."""
    _unsupported(reduce_op=reduce_op, reduce_res=reduce_res is not None,
                 reduce_cmd=reduce_cmd is not _REDUCE_IDLE)
    dst = on_chip(dst, "dst")
    data = on_chip(data, "data")
    op = _op(op, "unary")
    same_layout(dst, data, "dst", "data")
    values = read_f32(data, "data")
    scale_value = vector_operand(scale, data, "scale")
    if not (isinstance(scale_value, np.float32) and scale_value == 1.0):
        values = values * scale_value
    if bias is not None:
        if not hasattr(bias, "shape"):
            raise NKIRuleError(
                "activation-bias",
                f"on trn1 the activation bias must be a ({data.partitions}, 1) tile, not {bias!r}")
        values = values + vector_operand(bias, data, "bias")
    write(dst, op.unary(values))
    current().profile.record_elementwise("scalar", data.partitions, data.free_size)


def reciprocal(dst, data, name=None) -> None:
    """dst = 1 / data on the Vector Engine (full fp32)."""
    dst = on_chip(dst, "dst")
    data = on_chip(data, "data")
    same_layout(dst, data, "dst", "data")
    write(dst, np.float32(1.0) / read_f32(data, "data"))
    current().profile.record_elementwise("vector", data.partitions, data.free_size)


def reduce_axes(axis: object, data_shape: tuple[int, ...]) -> tuple[int, ...]:
    """Validated, sorted reduction axes: free axes only, the last contiguous ones."""
    axes = tuple(axis) if isinstance(axis, (tuple, list)) else (axis,)
    rank = len(data_shape)
    for a in axes:
        if isinstance(a, bool) or not isinstance(a, (int, np.integer)) or not 0 <= a < rank:
            raise NKIRuleError(
                "reduce-axis",
                f"axis {axis!r} invalid for data {shape_str(data_shape)}: axes are the "
                f"non-negative tensor axes 1..{rank - 1} (negative axes are not supported: the "
                "nki.language.sum / nki.isa.tensor_reduce pages list the legal axes as [1], "
                "[1, 2], ...)")
    axes = tuple(sorted(int(a) for a in axes))
    if 0 in axes:
        raise NKIRuleError(
            "partition-reduce",
            f"axis {axis!r} of data {shape_str(data_shape)} includes the partition axis 0; "
            "reduce partitions with a matmul against ones, or transpose first",
        )
    if axes != tuple(range(rank - len(axes), rank)):
        raise NKIRuleError(
            "reduce-axis",
            f"axis {axis!r} of data {shape_str(data_shape)} must be the last contiguous free axes")
    return axes


def tensor_reduce(dst, op, data, axis, negate=False, keepdims=False, name=None) -> None:
    """dst = reduce(op, data, free axes) on the Vector Engine; the partition axis is forbidden."""
    dst = on_chip(dst, "dst")
    data = on_chip(data, "data")
    axes = reduce_axes(axis, data.shape)
    op = _op(op, "reduce")
    result = op.reduce(read_f32(data, "data"), axis=axes, keepdims=bool(keepdims))
    if negate:
        result = -result
    same_partitions(dst, data, "dst", "data")
    if dst.free_size != int(np.prod(result.shape[1:])):
        raise NKIRuleError(
            "reduce-shape",
            f"dst {shape_str(dst.shape)} cannot hold the reduction of {shape_str(data.shape)} "
            f"over axis {axis!r} (result {shape_str(result.shape)})",
        )
    write(dst, np.asarray(result, dtype=np.float32))
    current().profile.record_elementwise("vector", data.partitions, data.free_size)


def memset(dst, value, engine=engine.unknown, name=None) -> None:
    """Fill dst with a constant on the Vector or GpSimd engine; the value's type must match the
    dtype (int for int tiles)."""
    dst = on_chip(dst, "dst")
    # engine.unknown lets the compiler choose; GpSimd cannot reach PSUM, so PSUM gets Vector.
    default = "vector" if dst.buffer is _buffers.psum else "gpsimd"
    where = _engine_name(engine, default, ("vector", "gpsimd"), "memset-engine",
                         f"memset of {shape_str(dst.shape)}")
    _gpsimd_keeps_off_psum(where, "memset", dst=dst)
    if dst.dtype.is_float:
        value = scalar_f32(value, "value")
    else:
        integer_fill(value, dst, "memset")
    write(dst, np.full(dst.shape, value))
    current().profile.record_elementwise(where, dst.partitions, dst.free_size)


def __getattr__(name: str) -> object:
    """``nisa.<name>`` outside the subset (``iota``, ``scalar_tensor_tensor``,
    ``tensor_partition_reduce``, ...): a rule error naming it, not an AttributeError."""
    if name.startswith("_"):
        raise AttributeError(name)
    raise not_in_subset(f"nisa.{name}")
