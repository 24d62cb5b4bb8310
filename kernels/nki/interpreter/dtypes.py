"""NKI data types and their emulation on numpy storage.

Float types are stored in float32 numpy arrays; types narrower than float32 are emulated by
rounding every written value to the type's precision with round-to-nearest-even (RNE).
Integer types are stored in their own numpy integer type. There is no float64 anywhere.
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from .errors import NKIRuleError

Rounder = Callable[[np.ndarray], np.ndarray]

_F32 = np.float32


def _round_mantissa(x: np.ndarray, dropped_bits: int) -> np.ndarray:
    """RNE-round float32 values to ``23 - dropped_bits`` mantissa bits (NaN kept as NaN)."""
    x = np.ascontiguousarray(x, dtype=_F32)
    bits = x.view(np.uint32)
    keep_mask = np.uint32((0xFFFFFFFF << dropped_bits) & 0xFFFFFFFF)
    half_minus_one = np.uint32((1 << (dropped_bits - 1)) - 1)
    lsb = (bits >> np.uint32(dropped_bits)) & np.uint32(1)
    out = ((bits + half_minus_one + lsb) & keep_mask).view(_F32)
    nan = np.isnan(x)
    if nan.any():
        out = np.where(nan, x, out)
    return out


def _round_bf16(x: np.ndarray) -> np.ndarray:
    return _round_mantissa(x, 16)


def _round_tf32(x: np.ndarray) -> np.ndarray:
    return _round_mantissa(x, 13)


def _round_fp16(x: np.ndarray) -> np.ndarray:
    # numpy's float32 -> float16 conversion is RNE, with overflow to inf and subnormals.
    with np.errstate(over="ignore"):
        return np.asarray(x, dtype=_F32).astype(np.float16).astype(_F32)


def _minifloat(mantissa_bits: int, min_exponent: int, max_value: float) -> Rounder:
    """Rounder for an IEEE-style fp8 format (the top exponent reserved for inf/NaN): RNE in the
    normal and subnormal ranges; what rounds past ``max_value`` overflows to inf, as IEEE
    rounding does (the documents do not describe saturation for these types)."""
    quantum = _F32(2.0 ** (min_exponent - mantissa_bits))
    smallest_normal = _F32(2.0 ** min_exponent)
    overflow_value = _F32(np.inf)
    limit = _F32(max_value)

    def rounder(x: np.ndarray) -> np.ndarray:
        x = np.asarray(x, dtype=_F32)
        y = _round_mantissa(x, 23 - mantissa_bits)
        tiny = np.abs(x) < smallest_normal
        if tiny.any():
            y = np.where(tiny, np.rint(x / quantum) * quantum, y).astype(_F32)
        big = np.abs(y) > limit
        if big.any():
            y = np.where(big, np.copysign(overflow_value, x), y).astype(_F32)
        return y

    return rounder


class DType:
    """An NKI dtype: its name, numpy storage type, size in bytes and write rounding."""

    __slots__ = ("name", "storage", "itemsize", "is_float", "rounder", "low", "high")

    def __init__(self, name: str, storage: type, itemsize: int,
                 rounder: Rounder | None = None) -> None:
        self.name = name
        self.storage = np.dtype(storage)
        self.itemsize = itemsize
        self.is_float = self.storage.kind == "f"
        self.rounder = rounder
        if self.is_float:
            self.low, self.high = -np.inf, np.inf
        else:
            info = np.iinfo(self.storage)
            self.low, self.high = int(info.min), int(info.max)

    def __repr__(self) -> str:
        return f"nl.{self.name}"

    def fill_value(self) -> float | int:
        """What ``nl.ndarray`` leaves in fresh memory (the simulator's NaN / 4 convention)."""
        return np.nan if self.is_float else 4

    def convert(self, values: np.ndarray) -> np.ndarray:
        """Values (any numeric array) as they would be stored in this dtype."""
        if self.is_float:
            values = np.asarray(values, dtype=_F32)
            return self.rounder(values) if self.rounder is not None else values
        # float -> int conversion: round to nearest even and saturate (documented decision).
        values = np.asarray(values)
        if values.dtype.kind == "f":
            values = np.rint(values)
        return np.clip(values, self.low, self.high).astype(self.storage)

    def assign(self, target: np.ndarray, values: np.ndarray) -> None:
        """Write ``values`` (already shaped like ``target``) into storage ``target``."""
        np.copyto(target, self.convert(values), casting="unsafe")


class BoolDType(DType):
    """``nl.bool_``: a boolean stored as one uint8 byte (NKI "Supported Data Types":
    "boolean stored as uint8"); every written value becomes 0 or 1."""

    __slots__ = ()

    def __init__(self) -> None:
        super().__init__("bool_", np.uint8, 1)

    def convert(self, values: np.ndarray) -> np.ndarray:
        """Nonzero -> 1, zero -> 0 (NaN counts as nonzero, as in numpy)."""
        return (np.asarray(values) != 0).astype(self.storage)


float32 = DType("float32", np.float32, 4)
tfloat32 = DType("tfloat32", np.float32, 4, _round_tf32)
bfloat16 = DType("bfloat16", np.float32, 2, _round_bf16)
float16 = DType("float16", np.float32, 2, _round_fp16)
# trn1's float8_e4m3 is the IEEE-style E4M3 (bias 7, exponent 1111 reserved for inf/NaN):
# largest finite 1.111b x 2^7 = 240. The extended-range, no-inf format (largest 448) is the
# separate nl.float8_e4m3fn, which trn1/trn2 do not support (docs/kernels.md FACTS Memory).
FP8_E4M3_MAX = 240.0
FP8_E5M2_MAX = 57344.0
float8_e4m3 = DType("float8_e4m3", np.float32, 1, _minifloat(3, -6, FP8_E4M3_MAX))
float8_e5m2 = DType("float8_e5m2", np.float32, 1, _minifloat(2, -14, FP8_E5M2_MAX))
int8 = DType("int8", np.int8, 1)
int16 = DType("int16", np.int16, 2)
int32 = DType("int32", np.int32, 4)
uint8 = DType("uint8", np.uint8, 1)
uint16 = DType("uint16", np.uint16, 2)
uint32 = DType("uint32", np.uint32, 4)
bool_ = BoolDType()

ALL_DTYPES: tuple[DType, ...] = (
    float32, tfloat32, bfloat16, float16, float8_e4m3, float8_e5m2,
    int8, int16, int32, uint8, uint16, uint32, bool_,
)

_FROM_NUMPY: dict[np.dtype, DType] = {
    np.dtype(np.float32): float32,
    np.dtype(np.float16): float16,
    np.dtype(np.int8): int8,
    np.dtype(np.int16): int16,
    np.dtype(np.int32): int32,
    np.dtype(np.uint8): uint8,
    np.dtype(np.uint16): uint16,
    np.dtype(np.uint32): uint32,
    np.dtype(np.bool_): bool_,
}

FP32_CLASS = (float32, tfloat32)  # the Tensor Engine's "fp32" input family


def from_numpy(dtype: np.dtype, what: str = "array") -> DType:
    """The NKI dtype for a numpy dtype; float64 and unsupported types are rule errors."""
    dtype = np.dtype(dtype)
    if dtype == np.float64:
        raise NKIRuleError(
            "no-fp64",
            f"{what} has dtype float64; no NeuronCore engine computes in float64: pass float32",
        )
    try:
        return _FROM_NUMPY[dtype]
    except KeyError:
        raise NKIRuleError("unsupported-dtype", f"{what} has unsupported dtype {dtype}") from None


def resolve(dtype: object) -> DType:
    """Accept an ``nl`` dtype or the equivalent numpy dtype/type object."""
    if isinstance(dtype, DType):
        return dtype
    if isinstance(dtype, str):
        raise NKIRuleError("unsupported-dtype",
                           f"dtype must be an nl dtype, not the string {dtype!r}")
    try:
        np_dtype = np.dtype(dtype)
    except TypeError:
        raise NKIRuleError("unsupported-dtype", f"not a dtype: {dtype!r}") from None
    return from_numpy(np_dtype, "dtype")


def output_numpy_dtype(dtype: DType) -> np.dtype:
    """numpy dtype of a kernel output handed back to the caller (bf16/tf32/fp8 -> float32)."""
    if dtype is float16:
        return np.dtype(np.float16)
    if dtype is bool_:
        return np.dtype(np.bool_)
    return dtype.storage
