"""The typed kernel interface: every kernel set satisfies it, stages extend it, and the kernel
package's structure keeps its promises (one source of trn1 numbers, docstrings citing files
that exist)."""
from __future__ import annotations

import ast
import inspect
import re
from pathlib import Path

import numpy as np
import pytest
import torch

import kernels
from kernels import trn1
from kernels.interface import KernelSet
from kernels.nki.launcher import Launcher
from kernels.nki_host.kernel_set import NkiKernels
from kernels.torch_backend import TorchKernels

REPO = Path(__file__).resolve().parent.parent
CPU = torch.device("cpu")
METHODS = ("gemm", "transform_gemm", "syrk", "trsm", "mp2_energy", "mp2_energy_fused",
           "mp2_energy_os", "mp2_energy_os_fused", "report")
ATTRIBUTES = ("backend", "precision", "dtype", "device", "executor", "accounting")


@pytest.fixture(scope="module")
def kernel_sets():
    return [TorchKernels(precision="fp64", device=CPU),
            NkiKernels(device=CPU, launcher=Launcher())]


def test_the_protocol_lists_every_method_and_attribute():
    members = {name for name in dir(KernelSet) if not name.startswith("_")}
    assert set(METHODS) <= members
    assert set(ATTRIBUTES) <= set(KernelSet.__annotations__)


def test_both_kernel_sets_satisfy_the_protocol(kernel_sets):
    for kernel_set in kernel_sets:
        assert isinstance(kernel_set, KernelSet), type(kernel_set).__name__
        for name in METHODS:
            assert callable(getattr(kernel_set, name)), name
        for name in ATTRIBUTES:
            assert hasattr(kernel_set, name), name


@pytest.mark.parametrize("name", METHODS)
def test_methods_take_the_protocols_parameters(kernel_sets, name):
    expected = list(inspect.signature(getattr(KernelSet, name)).parameters)
    for kernel_set in kernel_sets:
        actual = ["self", *inspect.signature(getattr(kernel_set, name)).parameters]
        assert actual == expected, f"{type(kernel_set).__name__}.{name}"


def test_load_returns_a_kernel_set():
    assert isinstance(kernels.load("torch", device="cpu"), KernelSet)
    assert isinstance(kernels.load("nki", device="cpu"), KernelSet)


def test_gemm_and_syrk_write_into_a_given_output(kernel_sets):
    """The energy step hands every pair the same storage: the result lands in it, equal to
    the freshly allocated one (syrk: its lower triangle)."""
    rng = np.random.default_rng(3)
    a = torch.from_numpy(rng.standard_normal((6, 4)))
    b = torch.from_numpy(rng.standard_normal((4, 5)))
    for kernel_set in kernel_sets:
        storage = torch.full((64,), np.nan, dtype=kernel_set.dtype)
        product = kernel_set.gemm(a, b, out=storage[:30].view(6, 5))
        assert product.data_ptr() == storage.data_ptr()
        assert torch.equal(storage[:30].view(6, 5), kernel_set.gemm(a, b))
        square = kernel_set.syrk(a, 2, out=storage[:36].view(6, 6))
        assert square.data_ptr() == storage.data_ptr()
        assert torch.equal(torch.tril(storage[:36].view(6, 6)), torch.tril(kernel_set.syrk(a, 2)))


def test_transform_gemm_is_recorded_under_its_own_name(kernel_sets):
    a = torch.randn(3, 4, dtype=torch.float64)
    b = torch.randn(4, 5, dtype=torch.float64)
    for kernel_set in kernel_sets:
        kernel_set.transform_gemm(a, b)
        assert kernel_set.accounting.calls[("transform_gemm", kernel_set.executor)] == 1


# ---- one source of trn1 numbers -------------------------------------------------------------
def test_trn1_module_imports_no_nki():
    tree = ast.parse((REPO / "kernels" / "trn1.py").read_text())
    imported = [alias.name for node in ast.walk(tree) if isinstance(node, ast.Import)
                for alias in node.names]
    imported += [node.module or "" for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)]
    assert not [name for name in imported if name.split(".")[0] == "nki"]


def test_kernels_and_interpreter_take_their_numbers_from_trn1():
    from kernels.nki.interpreter import install
    install()
    from kernels.nki import gemm, mp2_energy_fused, tiling, trsm
    from kernels.nki.interpreter import isa, language, state, tensor
    for module in (gemm, mp2_energy_fused, tiling, trsm):
        assert module.TILE is trn1.TILE
    assert tiling.TILE_N == trn1.TILE_N == trn1.MATMUL_N_MAX
    assert state.SBUF_BYTES_PER_PARTITION == trn1.SBUF_BYTES_PER_PARTITION
    assert state.PSUM_BANKS == trn1.PSUM_BANKS and state.PSUM_BANK_BYTES == trn1.PSUM_BANK_BYTES
    assert tensor.PARTITIONS == language.tile_size.pmax == trn1.PARTITIONS
    assert isa.MATMUL_N_MAX == language.tile_size.gemm_moving_fmax == trn1.MATMUL_N_MAX
    own_numbers = []  # module-level int constants of kernel sources: they belong in trn1.py
    for path in (REPO / "kernels" / "nki").glob("*.py"):
        for node in ast.parse(path.read_text()).body:
            if (isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant)
                    and isinstance(node.value.value, int)):
                own_numbers.append(f"{path.name}: {ast.unparse(node)}")
    assert not own_numbers


# ---- docstrings cite files that exist -------------------------------------------------------
CITED_PATH = re.compile(
    r"\b((?:kernels|docs|tests|benchmarks|dfmp2|molecules)/[\w/.]*\w\.(?:py|md))")


def test_docstrings_cite_only_files_that_exist():
    missing = []
    for path in sorted((REPO / "kernels").rglob("*.py")):
        tree = ast.parse(path.read_text())
        nodes = [tree] + [n for n in ast.walk(tree)
                          if isinstance(n, (ast.FunctionDef, ast.ClassDef, ast.AsyncFunctionDef))]
        for node in nodes:
            for cited in CITED_PATH.findall(ast.get_docstring(node) or ""):
                if not (REPO / cited).exists():
                    missing.append(f"{path.relative_to(REPO)}: {cited}")
    assert not missing
