"""``nki.jit`` stand-in: marks a kernel; calling it runs it through the interpreter."""

from __future__ import annotations

import functools
from typing import Any, Callable

from .errors import NKIRuleError

# Options removed or deprecated in NKI 0.3.0 (the NKI 0.3.0 update guide: do not pass them).
_REJECTED_OPTIONS = ("mode", "platform_target")


class JitKernel:
    """A kernel function marked with ``@nki.jit``; calling it is ``simulate(kernel)(...)``."""

    def __init__(self, func: Callable[..., Any], options: dict[str, Any]) -> None:
        self.func = func
        self.options = options
        functools.update_wrapper(self, func)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        from .simulate import simulate  # simulate imports this module

        return simulate(self)(*args, **kwargs)

    def __repr__(self) -> str:
        return f"<nki.jit kernel {self.func.__qualname__} (interpreter)>"


def jit(func: Callable[..., Any] | None = None, **options: Any) -> Any:
    """Use as ``@nki.jit`` or ``@nki.jit(...)``."""
    for name in _REJECTED_OPTIONS:
        if name in options:
            raise NKIRuleError("jit-option",
                               f"nki.jit({name}=...) is removed/deprecated in NKI 0.3.0")
    if func is None:
        return lambda f: JitKernel(f, options)
    return JitKernel(func, options)
