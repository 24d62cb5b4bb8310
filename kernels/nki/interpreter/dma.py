"""DMA: ``nl.load``, ``nl.load_transpose2d``, ``nl.store`` and ``nisa.dma_copy``."""

from __future__ import annotations

import enum

from kernels.trn1 import NEURON_CORE_VERSION

from . import buffers as _buffers
from .dtypes import DType, resolve
from .errors import NKIRuleError, shape_str
from .operands import read, tensor_arg, write
from .state import current
from .tensor import Tensor, allocate


class dge_mode(enum.Enum):
    """DMA descriptor generation mode; ``hwdge`` is checked (dtypes, target), the rest is not."""

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
_REMOVED_KEYWORDS = ("dst_rmw_op", "unique_indices")
# Hardware DGE exists from NeuronCore-v3 (trn2) on (nki.isa.dma_copy, dge_mode).
_HWDGE_MIN_CORE_VERSION = 3


def _record(src: Tensor, dst_dtype: DType) -> None:
    size = src.data.size
    current().profile.record_dma(size, size * max(src.dtype.itemsize, dst_dtype.itemsize))


def _from_hbm(src: object, what: str) -> Tensor:
    t = tensor_arg(src, what)
    if t.buffer.on_chip:
        raise NKIRuleError("load-source",
                           f"{what} {shape_str(t.shape)} must be an HBM tensor, not {t.buffer!r}")
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
            "dma-count",
            f"dst {shape_str(dst.shape)} and src {shape_str(src.shape)} hold different element "
            "counts")


def _check_hwdge(dst: Tensor, src: Tensor) -> None:
    """HWDGE moves raw bytes without casting (NKI 0.3.0 update guide, dma_copy dge_mode), and
    trn1 has no hardware DGE at all; the dtype rule is reported first, as the more specific."""
    if dst.dtype is not src.dtype:
        raise NKIRuleError(
            "dma-hwdge-dtype",
            f"dma_copy(dge_mode=hwdge) from {src.dtype!r} src {shape_str(src.shape)} to "
            f"{dst.dtype!r} dst {shape_str(dst.shape)}: hardware DGE needs equal dtypes",
        )
    if NEURON_CORE_VERSION < _HWDGE_MIN_CORE_VERSION:
        raise NKIRuleError(
            "dma-hwdge-target",
            f"dma_copy(dge_mode=hwdge) of src {shape_str(src.shape)}: hardware DGE needs "
            f"NeuronCore-v{_HWDGE_MIN_CORE_VERSION} or newer, and the target is trn1 "
            f"(NeuronCore-v{NEURON_CORE_VERSION}); leave dge_mode unset (or swdge)",
        )


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
        raise NKIRuleError("shape",
                           f"load_transpose2d needs a 2-D source, got {shape_str(src.shape)}")
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
        raise NKIRuleError("store-destination",
                           f"dst {shape_str(dst.shape)} must be an HBM tensor, not {dst.buffer!r}")
    _not_psum_source(value, "value")
    if not value.buffer.on_chip:
        raise NKIRuleError("store-source", f"value {shape_str(value.shape)} must be an SBUF tile")
    _same_count(dst, value)
    write(dst, read(value, "value"))
    _record(value, dst.dtype)


def dma_copy(dst, src, oob_mode=oob_mode.error, dge_mode=dge_mode.unknown, name=None,
             **removed) -> None:
    """dst = src between HBM and SBUF, or HBM and HBM.

    ``dst_rmw_op`` and ``unique_indices`` (read-modify-write DMA) were removed in NKI 0.3.0 (update
    guide: "dma_copy — dst_rmw_op and unique_indices Removed"; use nisa.dma_compute)."""
    for keyword in removed:
        if keyword not in _REMOVED_KEYWORDS:
            raise TypeError(f"dma_copy() got an unexpected keyword argument {keyword!r}")
        raise NKIRuleError(
            "dma-rmw",
            f"dma_copy({keyword}=...) was removed in NKI 0.3.0: dma_copy no longer does "
            "read-modify-write; accumulate on an engine, or with nisa.dma_compute",
        )
    for label, value, kind in (("oob_mode", oob_mode, _OOB), ("dge_mode", dge_mode, _DGE)):
        if not isinstance(value, kind):
            raise NKIRuleError("raw-enum", f"{label} must be an nisa.{label} member, got {value!r}")
    dst = tensor_arg(dst, "dst")
    src = tensor_arg(src, "src")
    _not_psum_source(src, "src")
    if dst.buffer is _buffers.psum:
        raise NKIRuleError("dma-to-psum",
                           f"dst {shape_str(dst.shape)} is a PSUM tile; DMA cannot write PSUM")
    _same_count(dst, src)
    if dge_mode is _DGE.hwdge:
        _check_hwdge(dst, src)
    write(dst, read(src, "src"))
    _record(src, dst.dtype)
