"""DMA: ``nl.load``, ``nl.load_transpose2d``, ``nl.store`` and ``nisa.dma_copy``."""

from __future__ import annotations

import enum

import numpy as np

from . import buffers as _buffers
from .dtypes import DType, resolve
from .errors import NKIRuleError, shape_str
from .ops import Op, canonical
from .operands import read, tensor_arg, write
from .state import current
from .tensor import Tensor, allocate


class dge_mode(enum.Enum):
    """DMA descriptor generation mode; only ``hwdge``'s dtype rule has an effect here."""

    unknown = "unknown"
    none = "none"
    swdge = "swdge"
    hwdge = "hwdge"


class oob_mode(enum.Enum):
    """Out-of-bounds handling of indirect DMA (only ``error`` is meaningful here)."""

    error = "error"
    skip = "skip"


_OOB = oob_mode
_DGE = dge_mode

def _record(src: Tensor, dst_dtype: DType) -> None:
    size = src.data.size
    current().profile.record_dma(size, size * max(src.dtype.itemsize, dst_dtype.itemsize))


def _from_hbm(src: object, what: str) -> Tensor:
    t = tensor_arg(src, what)
    if t.buffer.on_chip:
        raise NKIRuleError("load-source", f"{what} {shape_str(t.shape)} must be an HBM tensor, not {t.buffer!r}")
    return t


def _not_psum_source(t: Tensor, what: str) -> None:
    if t.buffer is _buffers.psum:
        raise NKIRuleError(
            "dma-from-psum",
            f"{what} {shape_str(t.shape)} is a PSUM tile; DMA cannot read PSUM: "
            "nisa.tensor_copy it to SBUF first",
        )


def _same_count(dst: Tensor, src: Tensor) -> None:
    if dst.data.size != src.data.size:
        raise NKIRuleError(
            "dma-count", f"dst {shape_str(dst.shape)} and src {shape_str(src.shape)} hold different element counts")


def load(src, dtype=None) -> Tensor:
    """Copy an HBM tensor (slice) into a new SBUF tile of the same shape."""
    src = _from_hbm(src, "src")
    out_dtype = src.dtype if dtype is None else resolve(dtype)
    tile = allocate(src.shape, out_dtype, _buffers.sbuf)
    write(tile, read(src, "src"))
    _record(src, out_dtype)
    return tile


def load_transpose2d(src, dtype=None) -> Tensor:
    """Copy a 2-D HBM tensor [F, P] into a new SBUF tile [P, F] (transposed)."""
    src = _from_hbm(src, "src")
    if src.ndim != 2:
        raise NKIRuleError("shape", f"load_transpose2d needs a 2-D source, got {shape_str(src.shape)}")
    out_dtype = src.dtype if dtype is None else resolve(dtype)
    tile = allocate((src.shape[1], src.shape[0]), out_dtype, _buffers.sbuf)
    write(tile, read(src, "src").T)
    _record(src, out_dtype)
    return tile


def store(dst, value) -> None:
    """Copy an SBUF tile into an HBM tensor (slice) with the same element count."""
    dst = tensor_arg(dst, "dst")
    value = tensor_arg(value, "value")
    if dst.buffer.on_chip:
        raise NKIRuleError("store-destination", f"dst {shape_str(dst.shape)} must be an HBM tensor, not {dst.buffer!r}")
    _not_psum_source(value, "value")
    if not value.buffer.on_chip:
        raise NKIRuleError("store-source", f"value {shape_str(value.shape)} must be an SBUF tile")
    _same_count(dst, value)
    write(dst, read(value, "value"))
    _record(value, dst.dtype)


def dma_copy(dst, src, dst_rmw_op=None, oob_mode=oob_mode.error, dge_mode=dge_mode.unknown,
             name=None) -> None:
    """dst = src (or dst += src with dst_rmw_op=nl.add) between HBM and SBUF, or HBM and HBM."""
    for label, value, kind in (("oob_mode", oob_mode, _OOB), ("dge_mode", dge_mode, _DGE)):
        if not isinstance(value, kind):
            raise NKIRuleError("raw-enum", f"{label} must be an nisa.{label} member, got {value!r}")
    dst = tensor_arg(dst, "dst")
    src = tensor_arg(src, "src")
    _not_psum_source(src, "src")
    if dst.buffer is _buffers.psum:
        raise NKIRuleError("dma-to-psum", f"dst {shape_str(dst.shape)} is a PSUM tile; DMA cannot write PSUM")
    _same_count(dst, src)
    if dge_mode is _DGE.hwdge and dst.dtype is not src.dtype:
        # HWDGE moves raw bytes without casting (NKI 0.3.0 update guide, dma_copy dge_mode).
        raise NKIRuleError(
            "dma-hwdge-dtype",
            f"dma_copy(dge_mode=hwdge) from {src.dtype!r} src {shape_str(src.shape)} to "
            f"{dst.dtype!r} dst {shape_str(dst.shape)}: hardware DGE needs equal dtypes",
        )
    values = read(src, "src")
    if dst_rmw_op is not None:
        dst_rmw_op = canonical(dst_rmw_op)
        if not (isinstance(dst_rmw_op, Op) and dst_rmw_op.name == "add"):
            raise NKIRuleError("unsupported-op", f"dst_rmw_op must be nl.add or None, got {dst_rmw_op!r}")
        values = read(dst, "dst").astype(np.float32) + values.reshape(dst.shape).astype(np.float32)
    write(dst, values)
    _record(src, dst.dtype)
