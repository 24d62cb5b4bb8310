"""Shared pieces of the interpreter rule tests (tests/test_interpreter_rules_*.py).

Importing this module installs the interpreter as ``nki`` (or skips the importing test module
when the real nki is installed: those tests target the interpreter), so the test modules can
import nki after it.
"""
from __future__ import annotations

import numpy as np
import pytest

from kernels.nki.interpreter import NKIRuleError, install, simulate

if not install():
    pytest.skip("the real nki is installed: these tests target the interpreter",
                allow_module_level=True)

import nki.language as nl  # noqa: E402

F32 = np.float32


def arr(*shape: int, dtype=F32) -> np.ndarray:
    return np.arange(int(np.prod(shape)), dtype=dtype).reshape(shape) % 7


def out_like(shape, dtype=nl.float32):
    return nl.ndarray(shape, dtype=dtype, buffer=nl.shared_hbm)


def sbuf(shape, dtype=nl.float32):
    return nl.zeros(shape, dtype=dtype, buffer=nl.sbuf)


def psum(shape):
    return nl.ndarray(shape, dtype=nl.float32, buffer=nl.psum)


def assert_rule_violation(kernel, args: tuple, rule: str, text: str) -> None:
    """``kernel(*args)`` is refused with ``rule``, and the message names ``text``."""
    with pytest.raises(NKIRuleError) as info:
        simulate(kernel)(*args)
    message = str(info.value)
    assert message.startswith(f"[{rule}]"), message
    assert info.value.rule == rule
    assert text in message, message
