"""``nki.simulate`` stand-in: run a kernel on numpy inputs and return numpy outputs."""

from __future__ import annotations

import functools
import inspect
from typing import Any, Callable

import numpy as np

from . import buffers as _buffers
from .dtypes import from_numpy, output_numpy_dtype
from .errors import NKIRuleError, shape_str
from .jit import JitKernel
from .profile import Profile
from .source_rules import check_kernel_source
from .state import launch
from .tensor import Tensor, wrap_input

_CONSTANT_TYPES = (bool, int, float, str, type(None), np.integer, np.floating, np.bool_)


def _check_signature(func: Callable[..., Any]) -> inspect.Signature:
    signature = inspect.signature(func)
    for param in signature.parameters.values():
        if param.kind is inspect.Parameter.KEYWORD_ONLY:
            raise NKIRuleError(
                "kernel-signature",
                f"kernel {func.__name__} has keyword-only parameter {param.name!r}; NKI 0.3.0 "
                "kernels may not use a '*' separator",
            )
    return signature


def _convert_argument(value: object, name: str) -> object:
    """numpy arrays become HBM input tensors; compile-time constants pass through."""
    if isinstance(value, np.ndarray):
        dtype = from_numpy(value.dtype, f"input {name!r} {shape_str(value.shape)}")
        return wrap_input(value, dtype, name)
    if isinstance(value, list):
        raise NKIRuleError("list-argument", f"argument {name!r} is a list; pass a tuple")
    if isinstance(value, tuple):
        return tuple(_convert_argument(v, f"{name}[{i}]") for i, v in enumerate(value))
    if isinstance(value, _CONSTANT_TYPES):
        return value
    raise NKIRuleError(
        "argument-type",
        f"argument {name!r} of type {type(value).__name__} is neither a numpy array nor a constant")


def _convert_output(value: object) -> object:
    if isinstance(value, tuple):
        return tuple(_convert_output(v) for v in value)
    if value is None:
        return None
    if not isinstance(value, Tensor):
        raise NKIRuleError("output-type", f"kernel returned {type(value).__name__}, not a tensor")
    if value.buffer is not _buffers.shared_hbm or value.storage.is_input:
        where = "a kernel input" if value.storage.is_input else f"in {value.buffer!r}"
        raise NKIRuleError(
            "output-buffer",
            f"returned tensor {shape_str(value.shape)} is {where}; kernel outputs must be "
            "allocated in the kernel with buffer=nl.shared_hbm",
        )
    if not value.storage.fully_written and not value.written.all():
        raise NKIRuleError(
            "output-unwritten",
            f"returned tensor {shape_str(value.shape)} has elements nothing stored; fill every "
            "element of an output (nl.store / nisa.dma_copy) before returning it",
        )
    return value.data.astype(output_numpy_dtype(value.dtype), copy=True)


def simulate(kernel: Any, *, profile: Profile | None = None) -> Callable[..., Any]:
    """``simulate(kernel)(*args, **kwargs)``: run ``kernel`` (a ``@nki.jit`` object or plain
    function) in the interpreter. Arrays become HBM inputs (copied: the caller's arrays are
    never mutated); other values are compile-time constants. Returns numpy output(s).
    Counts are added to ``profile`` when one is given."""
    func = kernel.func if isinstance(kernel, JitKernel) else kernel
    if not callable(func):
        raise TypeError(f"simulate() needs a kernel function, got {kernel!r}")

    @functools.wraps(func)
    def run(*args: Any, **kwargs: Any) -> Any:
        bound = _check_signature(func).bind(*args, **kwargs)
        check_kernel_source(func)
        with launch() as state:
            state.memory.kernel_code = getattr(func, "__code__", None)
            returned = False
            try:
                for name, value in bound.arguments.items():
                    bound.arguments[name] = _convert_argument(value, name)
                output = func(*bound.args, **bound.kwargs)
                returned = True
            finally:
                state.memory.close(returned)
            result = _convert_output(output)
        if profile is not None:
            profile.add(state.profile)
        return result

    return run
