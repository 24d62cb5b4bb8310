"""Math operator objects such as ``nl.add`` or ``nl.exp``.

In NKI the same name is both a function (``nl.add(x, y)``) and an operator handed to an
instruction (``nisa.tensor_tensor(..., op=nl.add)``). An :class:`Op` carries the numpy
implementation of each role it can play and the convenience function it runs when called.
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

_F32 = np.float32
_ONE = _F32(1.0)

# numpy functions accepted wherever an nl operator is (older NKI docs use np.add etc.).
_NUMPY_ALIASES: dict[object, Op] = {}


def canonical(op: object) -> object:
    """The nl operator for ``op`` (itself, or the one a numpy function stands for)."""
    if isinstance(op, Op):
        return op
    try:
        return _NUMPY_ALIASES.get(op, op)
    except TypeError:  # unhashable
        return op


class Op:
    """An NKI math operator: binary (elementwise), unary (activation) and/or reduction roles."""

    __slots__ = ("name", "binary", "unary", "reduce", "_call")

    def __init__(self, name: str, call: Callable[..., Any], *,
                 binary: Callable[[Any, Any], np.ndarray] | None = None,
                 unary: Callable[[np.ndarray], np.ndarray] | None = None,
                 reduce: Callable[..., np.ndarray] | None = None,
                 numpy_alias: object = None) -> None:
        self.name = name
        self.binary = binary
        self.unary = unary
        self.reduce = reduce
        self._call = call
        if numpy_alias is not None:
            _NUMPY_ALIASES[numpy_alias] = self

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._call(self, *args, **kwargs)

    def __repr__(self) -> str:
        return f"nl.{self.name}"


def rsqrt(x: np.ndarray) -> np.ndarray:
    """1 / sqrt(x) in fp32."""
    return _ONE / np.sqrt(x)


def reciprocal(x: np.ndarray) -> np.ndarray:
    """1 / x in fp32."""
    return _ONE / x


def relu(x: np.ndarray) -> np.ndarray:
    """max(x, 0) in fp32."""
    return np.maximum(x, _F32(0.0))


def sigmoid(x: np.ndarray) -> np.ndarray:
    """1 / (1 + exp(-x)) in fp32."""
    return _ONE / (_ONE + np.exp(-x))


def identity(x: np.ndarray) -> np.ndarray:
    """x unchanged."""
    return x


def equal(x: np.ndarray, y: Any) -> np.ndarray:
    """1.0 where x == y, else 0.0, in fp32 (written in the destination's dtype)."""
    return np.equal(x, y).astype(_F32)


def subtract_fold(x: np.ndarray, axis: tuple[int, ...], keepdims: bool = False) -> np.ndarray:
    """x0 - x1 - ... - x(n-1) over the reduced elements taken in row-major order.

    The reduced axes are the last contiguous ones (``tensor_reduce``'s rule), so they flatten to
    one axis; numpy's ``subtract.reduce`` folds a single axis from its first element."""
    kept = x.shape[:x.ndim - len(axis)]
    folded = np.subtract.reduce(x.reshape(kept + (-1,)), axis=-1)
    return folded.reshape(kept + (1,) * len(axis)) if keepdims else folded
