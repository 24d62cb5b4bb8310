"""``nl.dynamic_range`` loop indices: runtime values, not trace-time Python ints.

A ``dynamic_range`` loop runs on the device (it is not unrolled at trace time), so its induction
variable has no value while the kernel is traced: it can index tensors (``t[i * 128:(i + 1) *
128]``, ``nl.ds(i * 128, 128)``, ``t[i]``) through affine arithmetic, but Python cannot branch
on it, compare it, index a Python list or tuple with it, or pass it where a compile-time
constant is needed. The interpreter executes the iterations one by one, so each
:class:`LoopValue` carries the iteration's value for the indexing code to use, and refuses every
Python operation that would turn it into a trace-time value.
"""

from __future__ import annotations

from typing import Iterator

from .errors import NKIRuleError

RULE = "dynamic-loop-index"


class LoopValue:
    """An affine expression ``scale * i + offset`` of one ``dynamic_range`` iteration's index.

    Supports ``+`` / ``-`` with ints and other loop values and ``*`` by an int (the affine forms
    an access pattern can hold); anything that needs the value at trace time is a rule error."""

    __slots__ = ("_value", "_text")

    def __init__(self, value: int, text: str) -> None:
        self._value = value
        self._text = text

    def __repr__(self) -> str:
        return f"<dynamic_range index {self._text}>"

    def _refuse(self, use: str) -> NKIRuleError:
        return NKIRuleError(
            RULE,
            f"{use} the nl.dynamic_range loop index {self._text}: it is a runtime value, not a "
            "trace-time int; use nl.static_range for Python control flow, tuple indexing and "
            "compile-time arguments, or index tensors with it (t[i * 128:(i + 1) * 128], "
            "nl.ds(i * 128, 128))")

    # ---- affine arithmetic: the results stay runtime values -------------------------------

    def _combine(self, other: object, sign: int, text: str) -> LoopValue:
        if isinstance(other, LoopValue):
            return LoopValue(self._value + sign * other._value, text)
        if isinstance(other, int) and not isinstance(other, bool):
            return LoopValue(self._value + sign * other, text)
        raise self._refuse(f"arithmetic with {other!r} on")

    def __add__(self, other: object) -> LoopValue:
        return self._combine(other, 1, f"({self._text} + {other!r})")

    __radd__ = __add__

    def __sub__(self, other: object) -> LoopValue:
        return self._combine(other, -1, f"({self._text} - {other!r})")

    def __rsub__(self, other: object) -> LoopValue:
        return (-self)._combine(other, 1, f"({other!r} - {self._text})")

    def __neg__(self) -> LoopValue:
        return LoopValue(-self._value, f"-{self._text}")

    def __mul__(self, other: object) -> LoopValue:
        if isinstance(other, int) and not isinstance(other, bool):
            return LoopValue(self._value * other, f"{self._text} * {other}")
        raise self._refuse(f"multiplying by {other!r}")

    __rmul__ = __mul__

    # ---- everything that needs a trace-time value -----------------------------------------

    def __bool__(self) -> bool:
        raise self._refuse("Python control flow (if / while / and / or) on")

    def __index__(self) -> int:
        raise self._refuse("using as a Python index or int (tuple/list indexing, range()):")

    def __int__(self) -> int:
        raise self._refuse("int() of")

    def __float__(self) -> float:
        raise self._refuse("float() of")

    def __hash__(self) -> int:
        raise self._refuse("hashing (dict key, set member)")

    def _compare(self, other: object) -> bool:
        raise self._refuse(f"comparing with {other!r}")

    __eq__ = __ne__ = __lt__ = __le__ = __gt__ = __ge__ = _compare

    def _no_operator(self, other: object) -> LoopValue:
        raise self._refuse("non-affine arithmetic (/, //, %, **) on")

    __truediv__ = __rtruediv__ = __floordiv__ = __rfloordiv__ = _no_operator
    __mod__ = __rmod__ = __pow__ = __rpow__ = _no_operator


def concrete(value: object) -> object:
    """The value an index expression has in the iteration being executed: a :class:`LoopValue`'s
    current value, anything else unchanged. Only the indexing code may call this."""
    return value._value if isinstance(value, LoopValue) else value


def dynamic_range(*args: object) -> Iterator[LoopValue]:
    """``nl.dynamic_range(start, stop, step)``: a device loop; the bounds are trace-time ints,
    each iteration's index a :class:`LoopValue`."""
    for value in range(*args):
        yield LoopValue(value, "i")
