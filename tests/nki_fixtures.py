"""Fixtures of the NKI kernel tests (tests/test_nki_kernels_*.py), which load this module with
``pytest_plugins = ["nki_fixtures"]``: pytest's way to share fixtures outside conftest.py. It is
a module of its own, not part of nki_helpers.py, because the test modules import nki_helpers
before pytest loads the plugins, and pytest warns about a plugin imported before it loads it.
``shared_launcher`` is module-scoped: one launcher per test module.
"""
from __future__ import annotations

import pytest

from kernels.accounting import KernelAccounting
from kernels.nki import launcher as nki_launcher
from kernels.nki_host.kernel_set import NkiKernels
from nki_helpers import CPU


@pytest.fixture(scope="module")
def shared_launcher():
    return nki_launcher.Launcher()


@pytest.fixture
def nk(shared_launcher):
    """A fresh kernel set (own accounting) on the module's launcher."""
    return NkiKernels(accounting=KernelAccounting(), device=CPU, launcher=shared_launcher)


@pytest.fixture
def interpreter_only(shared_launcher):
    if shared_launcher.mode != "interpreter":
        pytest.skip("instruction counts come from the dfmp2 interpreter's Profile")
    from kernels.nki import interpreter
    return interpreter
