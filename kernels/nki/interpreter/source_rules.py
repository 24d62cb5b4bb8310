"""Rules on a kernel's Python source, which the NKI 0.3.0 compiler reads (it parses the kernel
into an AST instead of running it as Python).

``is`` / ``is not`` are rejected (NKI 0.3.0 update guide, "Replace is / is not with == / !="),
and so is a closure: a function that reads variables of an enclosing function, which the
compiler, reading the source alone, cannot see (REFERENCE "Programming model": no closures over
Python variables inside ``@nki.jit`` functions; sizes are literals or module constants).

Reach of the check: the kernel function and, transitively, every function it calls through a
module-level name (``helper(...)``, ``module.helper(...)``, another ``@nki.jit`` kernel) that is
written against NKI, i.e. defined in a module whose globals hold the ``nki``, ``nki.language``
or ``nki.isa`` stand-in (helper modules such as ``kernels/nki/pair_reduction.py``). Not
followed: calls through local variables, arguments or object attributes, the interpreter's own
code, and functions whose source cannot be read. A referenced helper is checked even when this
launch's trace does not reach it, so the verdict does not depend on the input shapes.
"""

from __future__ import annotations

import ast
import inspect
import textwrap
import types
from typing import Any, Callable

from . import isa, language
from .errors import NKIRuleError
from .jit import JitKernel

_INTERPRETER_PACKAGE = __name__.rpartition(".")[0]

# kernel code object -> (rule, message) of its first violation (None: clean); a kernel is
# parsed once.
_VERDICTS: dict[types.CodeType, tuple[str, str] | None] = {}


def check_kernel_source(kernel: Callable[..., Any]) -> None:
    """Raise ``[is-operator]`` when the kernel or a helper it reaches uses ``is`` / ``is not``,
    ``[closure]`` when one of them reads variables of an enclosing function."""
    code = getattr(kernel, "__code__", None)
    if code is None:  # a callable object, not a function: no source to read
        return
    if code not in _VERDICTS:
        _VERDICTS[code] = _first_violation(kernel)
    verdict = _VERDICTS[code]
    if verdict is not None:
        raise NKIRuleError(*verdict)


def _first_violation(kernel: types.FunctionType) -> tuple[str, str] | None:
    pending = [kernel]
    seen: set[types.CodeType] = set()
    while pending:
        func = pending.pop()
        if func.__code__ in seen:
            continue
        seen.add(func.__code__)
        captured = func.__code__.co_freevars
        if captured:
            return ("closure",
                    f"{func.__qualname__} ({func.__code__.co_filename}:"
                    f"{func.__code__.co_firstlineno}) reads {', '.join(captured)} from an "
                    "enclosing function: the NKI 0.3.0 compiler reads the kernel's source and "
                    "cannot see a closure's variables; pass them as arguments or make them "
                    "module constants")
        tree = _function_tree(func)
        if tree is None:
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Compare):
                for op in node.ops:
                    if isinstance(op, (ast.Is, ast.IsNot)):
                        spelled = "is not" if isinstance(op, ast.IsNot) else "is"
                        line = func.__code__.co_firstlineno + node.lineno - 1
                        return ("is-operator",
                                f"`{spelled}` in {func.__qualname__} "
                                f"({func.__code__.co_filename}:{line}): the NKI 0.3.0 "
                                "compiler does not support is / is not; compare with == / !=")
            elif isinstance(node, ast.Call):
                callee = _resolve(node.func, func.__globals__)
                if callee is not None and _written_against_nki(callee):
                    pending.append(callee)
    return None


def _function_tree(func: types.FunctionType) -> ast.AST | None:
    """The function's definition without its decorators, or None when the source is unreadable."""
    try:
        source = textwrap.dedent(inspect.getsource(func))
        module = ast.parse(source)
    except (OSError, TypeError, SyntaxError):
        return None
    definition = module.body[0]
    if isinstance(definition, (ast.FunctionDef, ast.AsyncFunctionDef)):
        definition.decorator_list = []  # `@nki.jit` is not kernel code
    return definition


def _resolve(expr: ast.expr, scope: dict[str, Any]) -> types.FunctionType | None:
    """The function a call's ``helper`` / ``module.helper`` / ``kernel.func`` names, if any."""
    target = _lookup(expr, scope)
    if isinstance(target, JitKernel):
        target = target.func
    return target if isinstance(target, types.FunctionType) else None


def _lookup(expr: ast.expr, scope: dict[str, Any]) -> object:
    if isinstance(expr, ast.Name):
        return scope.get(expr.id)
    if isinstance(expr, ast.Attribute):
        owner = _lookup(expr.value, scope)
        # attributes only of modules and kernels: getattr on other objects could run their code
        if isinstance(owner, (types.ModuleType, JitKernel)):
            return getattr(owner, expr.attr, None)
    return None


def _written_against_nki(func: types.FunctionType) -> bool:
    module_name = func.__module__ or ""
    if module_name == _INTERPRETER_PACKAGE or module_name.startswith(_INTERPRETER_PACKAGE + "."):
        return False
    return any(value is language or value is isa or getattr(value, "language", None) is language
               for value in func.__globals__.values() if isinstance(value, types.ModuleType))
