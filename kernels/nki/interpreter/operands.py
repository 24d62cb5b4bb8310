"""Operand checks and the read / write paths every instruction goes through."""

from __future__ import annotations

import numpy as np

from kernels.trn1 import ENGINE_START_PARTITION_STEPS, PARTITIONS

from . import buffers as _buffers
from .errors import NKIRuleError, shape_str
from .state import current
from .tensor import Tensor

_F32 = np.float32
_UNINITIALIZED_RULE = {_buffers.psum: "psum-uninitialized", _buffers.sbuf: "sbuf-uninitialized"}


def tensor_arg(value: object, what: str) -> Tensor:
    """``value`` if it is a tensor, else a rule error naming the argument.

    Every instruction operand passes here, which also settles the deferred capacity check of
    the latest allocation."""
    state = current()
    memory = state.memory
    if memory.pending is not None:
        memory.verify()
    if isinstance(value, Tensor):
        launch = value.storage.launch
        if launch is not None and launch is not state:
            raise NKIRuleError(
                "stale-tile",
                f"{what} {shape_str(value.shape)} is a {value.buffer!r} tile of an earlier kernel "
                "launch; on-chip memory does not outlive its launch")
        return value
    raise NKIRuleError("operand-type", f"{what} must be a tensor/tile, got {type(value).__name__}")


def on_chip(value: object, what: str) -> Tensor:
    """A tensor that must live in SBUF or PSUM (compute engines cannot address HBM), accessed
    from a start partition the engines can use (:func:`engine_start_partition`)."""
    t = tensor_arg(value, what)
    if not t.buffer.on_chip:
        raise NKIRuleError(
            "hbm-operand",
            f"{what} {shape_str(t.shape)} is in {t.buffer!r}; compute instructions read and "
            "write SBUF/PSUM tiles only (load it first)",
        )
    engine_start_partition(t, what)
    return t


def engine_start_partition(t: Tensor, what: str) -> None:
    """Refuse a compute-engine access of ``t`` that starts at a partition NeuronCore-v2 cannot
    start an access of that many partitions from (docs/kernels.md FACTS Engines).

    A tile the compiler places starts where its own partition count allows, at a multiple of
    its step, which is a multiple of the step of any view of it; so a view's offset within its
    tile decides. A tile placed with ``address=`` starts at its given partition."""
    count = t.partitions
    step = next(step for largest, step in ENGINE_START_PARTITION_STEPS if count <= largest)
    start = start_partition(t)
    if start % step == 0:
        return
    where = _start_text(t)
    starts = [str(p) for p in range(0, PARTITIONS - count + 1, step)]
    allowed = " or ".join(filter(None, (", ".join(starts[:-1]), starts[-1])))
    raise NKIRuleError(
        "start-partition",
        f"{what} {shape_str(t.shape)} starts at {where}; on NeuronCore-v2 a compute-engine "
        f"access of {count} partitions starts at partition {allowed} (an engine moves data "
        "across partitions only between such starts; otherwise use a DMA or a Tensor Engine "
        "transpose)",
    )


def start_partition(t: Tensor) -> int:
    """The partition an access of ``t`` starts at: its view's offset within its tile, plus the
    tile's partition where it was placed with ``address=`` (a tile the compiler places starts
    at a multiple of any step its views' offsets must keep)."""
    return t.partition_offset + (t.storage.partition_base or 0)


def _start_text(t: Tensor) -> str:
    base = t.storage.partition_base
    return (f"partition {start_partition(t)} (its tile is placed at partition {base})"
            if base is not None else f"partition {start_partition(t)} of its tile")


def matmul_operand_at_row_zero(t: Tensor, what: str) -> None:
    """Refuse a Tensor Engine input (a matmul's, a transpose's, which is a matmul against an
    identity) that does not start at partition 0: the contraction runs down the PE rows from
    row 0 unless ``tile_position`` places a smaller one in a row tile (NeuronCore-v2: rows
    64-127 for K <= 64), which the subset does not include."""
    if start_partition(t) != 0:
        raise NKIRuleError(
            "start-partition",
            f"{what} {shape_str(t.shape)} starts at {_start_text(t)}; a Tensor Engine input "
            "starts at partition 0 (a contraction at another partition needs tile_position, "
            "which the subset does not include: copy the operand to a tile at partition 0)",
        )


def in_buffer(t: Tensor, buffer: _buffers.Buffer, rule: str, what: str) -> None:
    """Require ``t`` to live in ``buffer``."""
    if t.buffer is not buffer:
        raise NKIRuleError(rule,
                           f"{what} {shape_str(t.shape)} must be in {buffer!r}, not {t.buffer!r}")


def read(t: Tensor, what: str) -> np.ndarray:
    """The stored values of ``t`` (a view); never-written elements are an error (kernel inputs
    are written by the caller)."""
    written = t.written
    if written is not None and not t.storage.fully_written and not written.all():
        rule = _UNINITIALIZED_RULE.get(t.buffer, "hbm-uninitialized")
        raise NKIRuleError(
            rule,
            f"{what} reads {t.buffer!r} tile {shape_str(t.shape)} where some elements were never "
            "written",
        )
    return t.data


def read_f32(t: Tensor, what: str) -> np.ndarray:
    """The values of ``t`` as float32 (engines compute in fp32)."""
    data = read(t, what)
    return data if data.dtype == _F32 else data.astype(_F32)


def write(t: Tensor, values: np.ndarray, by_tensor_engine: bool = False) -> None:
    """Store ``values`` (same element count per partition) into ``t``, rounding to its dtype, and
    mark them written (in PSUM, also whether the Tensor Engine wrote them)."""
    if values.shape != t.shape:
        values = values.reshape(t.shape)
    t.dtype.assign(t.data, values)
    if t.written is not None:
        t.written[...] = True
        if t.data.size == t.storage.size:
            t.storage.fully_written = True
    if t.matmul_written is not None:
        t.matmul_written[...] = by_tensor_engine
    if t.storage.is_input:
        current().profile.note(f"kernel writes into its input {t.storage.name or 'tensor'}")


def same_partitions(a: Tensor, b: Tensor, what_a: str, what_b: str) -> None:
    """Both tiles span the same number of partitions."""
    if a.partitions != b.partitions:
        raise NKIRuleError(
            "partition-mismatch",
            f"{what_a} {shape_str(a.shape)} and {what_b} {shape_str(b.shape)} have different "
            "partition counts",
        )


def same_layout(a: Tensor, b: Tensor, what_a: str, what_b: str) -> None:
    """Same partitions and the same number of elements per partition."""
    same_partitions(a, b, what_a, what_b)
    if a.free_size != b.free_size:
        raise NKIRuleError(
            "free-size-mismatch",
            f"{what_a} {shape_str(a.shape)} and {what_b} {shape_str(b.shape)} have different "
            "element counts per partition",
        )


def scalar_f32(value: object, what: str) -> np.float32:
    """A compile-time Python scalar as fp32 (Python floats become fp32 constants)."""
    if isinstance(value, (bool, int, float, np.integer, np.floating)):
        return _F32(value)
    raise NKIRuleError("operand-type", f"{what} must be a Python scalar or a tile, got {value!r}")


def integer_fill(value: object, t: Tensor, what: str) -> None:
    """Refuse a fill of int tile ``t`` that is no int (the 0.3.0 strict type matching) or lies
    outside its dtype: what the device stores then is not documented, and silently saturating
    would hide it."""
    if not isinstance(value, (int, np.integer)):
        raise NKIRuleError(
            "memset-type",
            f"{what} of {t.dtype!r} tile {shape_str(t.shape)} needs an int value, got {value!r}")
    if not t.dtype.low <= int(value) <= t.dtype.high:
        raise NKIRuleError(
            "memset-type",
            f"{what} of {t.dtype!r} tile {shape_str(t.shape)} with {value!r}, outside "
            f"{t.dtype!r} ({t.dtype.low} .. {t.dtype.high})")


def vector_operand(value: object, data: Tensor, what: str) -> np.ndarray | np.float32:
    """A tensor_scalar / activation operand: a scalar, or a (P, 1) fp32 tile matching ``data``."""
    if not isinstance(value, Tensor):
        return scalar_f32(value, what)
    t = on_chip(value, what)
    if t.shape != (data.partitions, 1):
        raise NKIRuleError(
            "operand-shape",
            f"{what} {shape_str(t.shape)} must be a scalar or a ({data.partitions}, 1) tile "
            f"for data {shape_str(data.shape)}",
        )
    if t.dtype.name != "float32":
        raise NKIRuleError("operand-dtype",
                           f"{what} {shape_str(t.shape)} must be float32, not {t.dtype!r}")
    col = read_f32(t, what)
    return col.reshape((data.partitions,) + (1,) * (data.ndim - 1))
