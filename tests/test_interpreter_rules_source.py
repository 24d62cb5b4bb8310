"""Rules of the NKI interpreter on NKI 0.3.0 source (``is``, slicing, nl.arange), engine
placement, DMA modes and initialisation; each triggered by a small deliberately wrong kernel,
plus the rules outside kernels (jit options, instructions outside a kernel, tile lifetimes,
helper modules)."""

from __future__ import annotations

import importlib
import sys
import textwrap

import numpy as np
import pytest

# importing interpreter_rule_helpers installs the interpreter as nki (or skips the module)
from interpreter_rule_helpers import arr, assert_rule_violation, out_like, psum, sbuf
from kernels.nki.interpreter import NKIRuleError, simulate

import nki
import nki.isa as nisa
import nki.language as nl


# ---- rules of NKI 0.3.0 source, slicing, engines and initialisation --------------------------

def is_set(flag):
    """A helper in a module written against NKI: traced with the kernel, so checked with it."""
    return flag is not None


@nki.jit
def k_is(a, flag=None):
    if flag is None:
        return a
    return a


@nki.jit
def k_is_in_helper(a):
    if is_set(a):
        return a
    return a


def copy_kernel_of(rows):
    """A kernel built by a factory: its tile size lives in the factory's frame (a closure)."""
    @nki.jit
    def k_closure(a):
        out = nl.ndarray((rows, 4), dtype=nl.float32, buffer=nl.shared_hbm)
        nl.store(out, nl.load(a[0:rows, 0:4]))
        return out
    return k_closure


def row_count_of(rows):
    def row_count(a):
        return nl.tile_size.pmax if a.shape[0] > rows else a.shape[0]
    return row_count


clamped_rows = row_count_of(64)  # a module-level helper that is a closure


@nki.jit
def k_closure_helper(a):
    out = nl.ndarray((clamped_rows(a), 4), dtype=nl.float32, buffer=nl.shared_hbm)
    nl.store(out, nl.load(a[0:clamped_rows(a), 0:4]))
    return out


@nki.jit
def k_nested_slice_tile(a):
    t = nl.load(a)
    nisa.memset(dst=t[0:64, :][0:32, :], value=0.0)


@nki.jit
def k_nested_slice_hbm(a):
    nl.load(a[0:4][0:2, :])


@nki.jit
def k_accumulate_onto_memset(a, b):
    ps = psum((64, 64))
    nisa.memset(dst=ps, value=0.0)
    nisa.nc_matmul(dst=ps, stationary=nl.load(a), moving=nl.load(b), accumulate=True)


@nki.jit
def k_accumulate_none_onto_copy(a, b):
    ps = psum((64, 64))
    nisa.tensor_copy(dst=ps, src=nl.load(b))
    nisa.nc_matmul(dst=ps, stationary=nl.load(a), moving=nl.load(b))


@nki.jit
def k_gpsimd_copy_psum():
    ps = psum((128, 8))
    nisa.memset(dst=ps, value=0.0)
    nisa.tensor_copy(dst=sbuf((128, 8)), src=ps, engine=nisa.engine.gpsimd)


@nki.jit
def k_gpsimd_tensor_tensor_psum(a):
    ps = psum((128, 8))
    nisa.memset(dst=ps, value=0.0)
    nisa.tensor_tensor(dst=sbuf((128, 8)), data1=nl.load(a), data2=ps, op=nl.add,
                       engine=nisa.engine.gpsimd)


@nki.jit
def k_gpsimd_memset_psum():
    nisa.memset(dst=psum((128, 8)), value=0.0, engine=nisa.engine.gpsimd)


@nki.jit
def k_power_psum(a):
    ps = psum((128, 8))
    nisa.memset(dst=ps, value=2.0)
    nl.power(ps, nl.load(a))  # nl.power runs on GpSimd by default


@nki.jit
def k_scalar_tensor_copy(a):
    nisa.tensor_copy(dst=sbuf((128, 8)), src=nl.load(a), engine=nisa.engine.scalar)


@nki.jit
def k_scalar_memset():
    nisa.memset(dst=nl.ndarray((128, 8), dtype=nl.float32, buffer=nl.sbuf), value=0.0,
                engine=nisa.engine.scalar)


@nki.jit
def k_hwdge_dtype(a):
    t = nl.ndarray((4, 4), dtype=nl.bfloat16, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=a, dge_mode=nisa.dge_mode.hwdge)


@nki.jit
def k_dma_rmw(a):
    out = out_like((4, 4))
    nisa.dma_copy(dst=out, src=a)
    nisa.dma_copy(dst=out, src=a, dst_rmw_op=nl.add)
    return out


@nki.jit
def k_dma_unique_indices(a):
    out = out_like((4, 4))
    nisa.dma_copy(dst=out, src=a, unique_indices=True)
    return out


@nki.jit
def k_nl_arange(a):
    return a[nl.arange(4), 0:4]


@nki.jit
def k_hwdge_on_trn1(a):
    t = nl.ndarray((4, 4), dtype=nl.float32, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=a, dge_mode=nisa.dge_mode.hwdge)


@nki.jit
def k_gpsimd_tensor_scalar(a):
    nisa.tensor_scalar(dst=sbuf((128, 8)), data=nl.load(a), op0=nl.multiply, operand0=2.0,
                       engine=nisa.engine.gpsimd)


@nki.jit
def k_gpsimd_tensor_scalar_second_op(a):
    nisa.tensor_scalar(dst=sbuf((128, 8)), data=nl.load(a), op0=nl.rsqrt, operand0=1.0,
                       op1=nl.add, operand1=1.0, engine=nisa.engine.gpsimd)


@nki.jit
def k_sbuf_uninitialized(a):
    out = out_like((4, 8))
    nl.store(out, nl.ndarray((4, 8), dtype=nl.float32, buffer=nl.sbuf))
    return out


@nki.jit
def k_sbuf_partly_written(a):
    t = nl.ndarray((4, 8), dtype=nl.float32, buffer=nl.sbuf)
    nisa.dma_copy(dst=t[0:4, 0:6], src=a)
    nl.exp(t)


@nki.jit
def k_address_malformed():
    nl.ndarray((64, 8), dtype=nl.float32, buffer=nl.sbuf, address=(0,))


@nki.jit
def k_address_past_partitions():
    nl.ndarray((64, 8), dtype=nl.float32, buffer=nl.sbuf, address=(96, 0))


@nki.jit
def k_psum_tile_across_banks():
    # 2 KiB per partition at free offset 1: two banks under either reading of the offset.
    nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.psum, address=(0, 1))


@nki.jit
def k_placed_tiles_overlap(a):
    x = nl.ndarray((128, 8), dtype=nl.float32, buffer=nl.sbuf, address=(0, 0))
    nisa.dma_copy(dst=x, src=a)
    y = nl.ndarray((128, 8), dtype=nl.float32, buffer=nl.sbuf, address=(0, 0))
    nisa.memset(dst=y, value=5.0)
    out = nl.ndarray((128, 8), dtype=nl.float32, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=out, src=x)
    return out


@nki.jit
def k_placed_tiles_apart(a):
    x = nl.ndarray((128, 8), dtype=nl.float32, buffer=nl.sbuf, address=(0, 0))
    nisa.dma_copy(dst=x, src=a)
    y = nl.ndarray((128, 8), dtype=nl.float32, buffer=nl.sbuf, address=(0, 4096))
    nisa.memset(dst=y, value=5.0)
    out = nl.ndarray((128, 8), dtype=nl.float32, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=out, src=x)
    return out


KEPT_TILES = []


@nki.jit
def k_keep_a_tile(a):
    tile = nl.load(a)
    KEPT_TILES.append(tile)
    out = nl.ndarray((4, 4), dtype=nl.float32, buffer=nl.shared_hbm)
    nl.store(out, tile)
    return out


@nki.jit
def k_reuse_a_kept_tile():
    out = nl.ndarray((4, 4), dtype=nl.float32, buffer=nl.shared_hbm)
    nl.store(out, KEPT_TILES[-1])
    return out


def test_a_tile_of_an_earlier_launch_is_refused():
    """On-chip memory does not outlive its launch: a tile kept in a global and read by the
    next launch returned the earlier launch's values."""
    simulate(k_keep_a_tile)(arr(4, 4))
    assert_rule_violation(k_reuse_a_kept_tile, (), "stale-tile", "(4, 4)")


def test_placed_tiles_apart_are_accepted():
    data = arr(128, 8)
    assert np.array_equal(simulate(k_placed_tiles_apart)(data), data)


@nki.jit
def k_power_reduce(a):
    nisa.tensor_reduce(dst=sbuf((128, 1)), op=nl.power, data=nl.load(a), axis=1)


@nki.jit
def k_equal_unbroadcast(a, b):
    nl.equal(nl.load(a), nl.load(b))


@nki.jit
def k_equal_no_tile():
    nl.equal(1.0, 1.0)


@nki.jit
def k_dynamic_if(a):
    t = nl.load(a)
    for i in nl.dynamic_range(2):
        if i == 0:
            nisa.memset(dst=t, value=0.0)


@nki.jit
def k_dynamic_bool(a):
    for i in nl.dynamic_range(2):
        if i:
            nl.load(a)


@nki.jit
def k_dynamic_tuple_index(a):
    tiles = (nl.load(a), nl.load(a))
    for i in nl.dynamic_range(2):
        nisa.memset(dst=tiles[i], value=0.0)


@nki.jit
def k_dynamic_accumulate(a, b):
    ps = psum((64, 64))
    for k in nl.dynamic_range(2):
        nisa.nc_matmul(dst=ps, stationary=nl.load(a), moving=nl.load(b), accumulate=k)


@nki.jit
def k_dynamic_shape(a):
    for i in nl.dynamic_range(1, 3):
        nl.ndarray((4, i), dtype=nl.float32, buffer=nl.sbuf)


@nki.jit
def k_nisa_iota(a):
    nisa.iota(dst=sbuf((4, 4)), expr=0)


@nki.jit
def k_nisa_scalar_tensor_tensor(a):
    t = nl.load(a)
    nisa.scalar_tensor_tensor(dst=sbuf((4, 4)), data=t, op0=nl.add, operand0=1.0, op1=nl.add,
                              operand1=t)


@nki.jit
def k_nisa_tensor_partition_reduce(a):
    nisa.tensor_partition_reduce(dst=sbuf((1, 4)), op=nl.add, data=nl.load(a))


@nki.jit
def k_tile_size_unpublished(a):
    nl.ndarray((128, nl.tile_size.total_available_sbuf_size // 4), dtype=nl.float32)


@nki.jit
def k_tile_plus_tile(a):
    t = nl.load(a)
    return t + t


@nki.jit
def k_tile_times_scalar(a):
    return 2.0 * nl.load(a)


CASES = [
    # (kernel, args, rule id, text that must appear: the offending shape or value)
    (k_is, (arr(4, 4),), "is-operator", "`is` in k_is"),
    (k_is_in_helper, (arr(4, 4),), "is-operator", "`is not` in is_set"),
    (copy_kernel_of(8), (arr(8, 4),), "closure", "copy_kernel_of.<locals>.k_closure"),
    (k_closure_helper, (arr(8, 4),), "closure", "row_count_of.<locals>.row_count"),
    (k_nested_slice_tile, (arr(128, 8),), "nested-slice", "(64, 8)"),
    (k_nested_slice_hbm, (arr(8, 8),), "nested-slice", "(4, 8)"),
    (k_accumulate_onto_memset, (arr(64, 64), arr(64, 64)), "psum-accumulate-init", "(64, 64)"),
    (k_accumulate_none_onto_copy, (arr(64, 64), arr(64, 64)), "psum-accumulate-init",
     "accumulate=None"),
    (k_gpsimd_copy_psum, (), "gpsimd-psum", "src (128, 8)"),
    (k_gpsimd_tensor_tensor_psum, (arr(128, 8),), "gpsimd-psum", "data2 (128, 8)"),
    (k_gpsimd_memset_psum, (), "gpsimd-psum", "dst (128, 8)"),
    (k_power_psum, (arr(128, 8),), "gpsimd-psum", "data1 (128, 8)"),
    (k_scalar_tensor_copy, (arr(128, 8),), "tensor-copy-engine", "scalar"),
    (k_scalar_memset, (), "memset-engine", "scalar"),
    (k_hwdge_dtype, (arr(4, 4),), "dma-hwdge-dtype", "nl.bfloat16"),
    (k_hwdge_on_trn1, (arr(4, 4),), "dma-hwdge-target", "(4, 4)"),
    (k_dma_rmw, (arr(4, 4),), "dma-rmw", "dst_rmw_op"),
    (k_dma_unique_indices, (arr(4, 4),), "dma-rmw", "unique_indices"),
    (k_nl_arange, (arr(4, 4),), "nl-arange", "nl.arange(4)"),
    (k_gpsimd_tensor_scalar, (arr(128, 8),), "tensor-scalar-engine", "nl.multiply"),
    (k_gpsimd_tensor_scalar_second_op, (arr(128, 8),), "tensor-scalar-engine", "nl.add"),
    (k_sbuf_uninitialized, (arr(4, 8),), "sbuf-uninitialized", "(4, 8)"),
    (k_sbuf_partly_written, (arr(4, 6),), "sbuf-uninitialized", "(4, 8)"),
    (k_address_malformed, (), "address", "(0,)"),
    (k_address_past_partitions, (), "address", "(64, 8)"),
    (k_psum_tile_across_banks, (), "psum-bank", "spans two banks"),
    (k_placed_tiles_overlap, (arr(128, 8),), "address-overlap", "overlaps the live tile"),
    (k_power_reduce, (arr(128, 8),), "unsupported-op", "nl.power"),
    (k_equal_unbroadcast, (arr(1, 1), arr(128, 1)), "unbroadcast", "(128, 1)"),
    (k_equal_no_tile, (), "operand-type", "nl.equal"),
    (k_dynamic_if, (arr(4, 4),), "dynamic-loop-index", "comparing with 0"),
    (k_dynamic_bool, (arr(4, 4),), "dynamic-loop-index", "control flow"),
    (k_dynamic_tuple_index, (arr(4, 4),), "dynamic-loop-index", "Python index"),
    (k_dynamic_accumulate, (arr(64, 64), arr(64, 64)), "dynamic-loop-index", "comparing"),
    (k_dynamic_shape, (arr(4, 4),), "shape", "(4, <dynamic_range index i>)"),
    (k_nisa_iota, (arr(4, 4),), "not-in-subset", "nisa.iota"),
    (k_nisa_scalar_tensor_tensor, (arr(4, 4),), "not-in-subset", "nisa.scalar_tensor_tensor"),
    (k_nisa_tensor_partition_reduce, (arr(4, 4),), "not-in-subset",
     "nisa.tensor_partition_reduce"),
    (k_tile_size_unpublished, (arr(4, 4),), "not-in-subset",
     "nl.tile_size.total_available_sbuf_size (the NKI 0.3.0 reference names it but publishes "
     "no value"),
    (k_tile_plus_tile, (arr(4, 4),), "not-in-subset", "Python arithmetic operator"),
    (k_tile_times_scalar, (arr(4, 4),), "not-in-subset", "Python arithmetic operator"),
]


@pytest.mark.parametrize(
    "kernel, args, rule, text", CASES,
    ids=[f"{c[2]}-{c[0].__name__}" for c in CASES])
def test_rule_violation_is_reported(kernel, args, rule, text):
    assert_rule_violation(kernel, args, rule, text)


def test_jit_rejects_removed_options():
    with pytest.raises(NKIRuleError, match=r"\[jit-option\]"):
        nki.jit(mode="simulation")


def test_instructions_outside_a_kernel_are_rejected():
    with pytest.raises(NKIRuleError, match=r"\[outside-kernel\]"):
        nl.ndarray((4, 4), dtype=nl.float32, buffer=nl.sbuf)


def test_rebinding_tiles_in_a_loop_frees_them():
    @nki.jit
    def many_psum_tiles(a):
        out = nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.shared_hbm)
        for _ in nl.affine_range(32):  # each iteration rebinds: at most 2 banks live
            ps = nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.psum)
            nisa.memset(dst=ps, value=0.0)
            big = nl.ndarray((128, 40000), dtype=nl.float32, buffer=nl.sbuf)  # 160 KB/partition
            nisa.memset(dst=big, value=1.0)
        t = nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_copy(dst=t, src=ps)
        nl.store(out, t)
        return out

    out = simulate(many_psum_tiles)(arr(4, 4))
    assert np.all(out == 0)


def test_is_check_reaches_helper_modules_written_against_nki(tmp_path, monkeypatch):
    """A kernel module calling helpers from another module, like kernels/nki/pair_reduction.py:
    a helper module that imports nki is checked with the kernel; a plain Python one is not."""
    (tmp_path / "rule_nki_helpers.py").write_text(textwrap.dedent("""
        import nki.language as nl

        def width(n):
            return nl.tile_size.pmax if n is None else n
    """))
    (tmp_path / "rule_plain_helpers.py").write_text(textwrap.dedent("""
        def width(n):
            return 128 if n is None else n
    """))
    (tmp_path / "rule_kernels.py").write_text(textwrap.dedent("""
        import nki
        import nki.language as nl
        import rule_nki_helpers
        import rule_plain_helpers

        @nki.jit
        def via_nki_helper(a):
            out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
            nl.store(out, nl.load(a[0:rule_nki_helpers.width(None), :]))
            return out

        @nki.jit
        def via_plain_helper(a):
            out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
            nl.store(out, nl.load(a[0:rule_plain_helpers.width(None), :]))
            return out
    """))
    monkeypatch.syspath_prepend(str(tmp_path))
    names = ("rule_kernels", "rule_nki_helpers", "rule_plain_helpers")
    try:
        kernels = importlib.import_module("rule_kernels")
        with pytest.raises(NKIRuleError,
                           match=r"^\[is-operator\] `is` in width .*rule_nki_helpers"):
            simulate(kernels.via_nki_helper)(arr(128, 4))
        np.testing.assert_array_equal(simulate(kernels.via_plain_helper)(arr(128, 4)), arr(128, 4))
    finally:
        for name in names:
            sys.modules.pop(name, None)
