"""Every rule of the NKI interpreter, triggered by a small deliberately wrong kernel."""

from __future__ import annotations

import importlib
import sys
import textwrap

import numpy as np
import pytest

from kernels.nki.interpreter import NKIRuleError, install, simulate

if not install():
    pytest.skip("the real nki is installed: these tests target the interpreter",
                allow_module_level=True)

import nki  # noqa: E402
import nki.isa as nisa  # noqa: E402
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


# ---- allocation, shapes, indexing -------------------------------------------------------------

@nki.jit
def k_partition_limit():
    nl.ndarray((256, 4), dtype=nl.float32, buffer=nl.sbuf)


@nki.jit
def k_load_1d(a):
    nl.load(a)


@nki.jit
def k_partition_step(a):
    t = nl.load(a)
    return t[0:128:2, :]


@nki.jit
def k_partition_reshape(a):
    nl.load(a).reshape((64, 8))


@nki.jit
def k_reshape(a):
    a.reshape((5, 5))


@nki.jit
def k_index_bounds(a):
    return a[0:129, :]


@nki.jit
def k_index_pattern(a):
    i = np.arange(3)
    return a[i * i, 0:4]


@nki.jit
def k_index_type(a):
    return a["rows"]


@nki.jit
def k_index_rank(a):
    return a[0, 0, 0]


@nki.jit
def k_shape():
    nl.ndarray((0, 4), dtype=nl.float32, buffer=nl.sbuf)


@nki.jit
def k_buffer_name():
    nl.ndarray((4, 4), dtype=nl.float32, buffer="sbuf")


@nki.jit
def k_identity(a):
    return a


@nki.jit
def k_no_assign(a):
    t = nl.load(a)
    t[0:4, 0:4] = nl.load(a)


@nki.jit
def k_bad_dtype():
    nl.ndarray((4, 4), dtype="float32", buffer=nl.sbuf)


# ---- DMA ------------------------------------------------------------------------------------

@nki.jit
def k_store_psum(a):
    out = out_like((4, 4))
    ps = psum((4, 4))
    nisa.memset(dst=ps, value=0.0)
    nl.store(out, ps)
    return out


@nki.jit
def k_dma_copy_psum(a):
    out = out_like((4, 4))
    ps = psum((4, 4))
    nisa.memset(dst=ps, value=0.0)
    nisa.dma_copy(dst=out, src=ps)
    return out


@nki.jit
def k_dma_to_psum(a):
    ps = psum((4, 4))
    nisa.dma_copy(dst=ps, src=a)


@nki.jit
def k_dma_count(a):
    out = out_like((4, 4))
    nl.store(out, nl.load(a))
    return out


@nki.jit
def k_load_source(a):
    nl.load(nl.load(a))


@nki.jit
def k_store_destination(a):
    t = nl.load(a)
    nl.store(sbuf((4, 4)), t)


@nki.jit
def k_store_source(a):
    out = out_like((4, 4))
    nl.store(out, a)
    return out


@nki.jit
def k_raw_enum(a):
    out = out_like((4, 4))
    nisa.dma_copy(dst=out, src=a, dge_mode=0)
    return out


# ---- Tensor Engine --------------------------------------------------------------------------

@nki.jit
def k_matmul_m(a, b):
    ps = psum((128, 64))
    nisa.nc_matmul(ps, nl.load(a), nl.load(b))


@nki.jit
def k_matmul_n(a, b):
    ps = psum((64, 512))
    nisa.nc_matmul(ps, nl.load(a), nl.load(b))


@nki.jit
def k_matmul_buffer(a, b):
    ps = psum((64, 64))
    st = psum((64, 64))
    nisa.memset(dst=st, value=1.0)
    nisa.nc_matmul(dst=ps, stationary=st, moving=nl.load(b))


@nki.jit
def k_matmul_dst_sbuf(a, b):
    nisa.nc_matmul(dst=sbuf((64, 64)), stationary=nl.load(a), moving=nl.load(b))


@nki.jit
def k_matmul_dtype(a, b):
    ps = psum((64, 64))
    nisa.nc_matmul(ps, nl.load(a), nl.load(b, dtype=nl.bfloat16))


@nki.jit
def k_matmul_shape(a, b):
    ps = psum((64, 64))
    nisa.nc_matmul(ps, nl.load(a), nl.load(b))


@nki.jit
def k_transpose_limit(a):
    nl.transpose(nl.load(a))


@nki.jit
def k_transpose_buffer(a):
    nisa.nc_transpose(dst=sbuf((32, 64)), data=nl.load(a))


@nki.jit
def k_transpose_shape(a):
    nisa.nc_transpose(dst=psum((64, 64)), data=nl.load(a))


@nki.jit
def k_transpose_dtype(a):
    nisa.nc_transpose(dst=psum((32, 64)), data=nl.load(a, dtype=nl.bfloat16))


@nki.jit
def k_unsupported(a, b):
    ps = psum((64, 64))
    nisa.nc_matmul(ps, nl.load(a), nl.load(b), is_transpose=True)


# ---- PSUM / SBUF capacity and initialisation ------------------------------------------------

@nki.jit
def k_psum_uninitialized():
    t = sbuf((128, 512))
    nisa.tensor_copy(dst=t, src=psum((128, 512)))


@nki.jit
def k_psum_accumulate_unwritten(a, b):
    ps = psum((64, 64))
    nisa.nc_matmul(ps, nl.load(a), nl.load(b), accumulate=True)


@nki.jit
def k_psum_bank():
    psum((128, 1024))


@nki.jit
def k_psum_banks_live():
    tiles = []
    for _ in nl.static_range(9):
        ps = psum((128, 512))
        nisa.memset(dst=ps, value=0.0)
        tiles.append(ps)


@nki.jit
def k_sbuf_tile_too_big():
    nl.ndarray((128, 50000), dtype=nl.float32, buffer=nl.sbuf)


@nki.jit
def k_sbuf_capacity():
    a = nl.zeros((128, 32768), dtype=nl.float32, buffer=nl.sbuf)
    b = nl.zeros((128, 32768), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_copy(dst=b, src=a)


# ---- Vector / Scalar engine -----------------------------------------------------------------

@nki.jit
def k_tensor_divide(a):
    t = nl.load(a)
    nisa.tensor_tensor(dst=sbuf((128, 8)), data1=t, data2=t, op=nl.divide)


@nki.jit
def k_np_divide(a):
    t = nl.load(a)
    nisa.tensor_tensor(dst=sbuf((128, 8)), data1=t, data2=t, op=np.divide)


@nki.jit
def k_raw_engine(a):
    nisa.tensor_copy(dst=sbuf((128, 8)), src=nl.load(a), engine=1)


@nki.jit
def k_nl_divide(a):
    t = nl.load(a)
    nl.divide(t, t)


@nki.jit
def k_partition_mismatch(a, b):
    nisa.tensor_tensor(dst=sbuf((64, 8)), data1=nl.load(a), data2=nl.load(b), op=nl.add)


@nki.jit
def k_free_size_mismatch(a, b):
    nisa.tensor_tensor(dst=sbuf((128, 8)), data1=nl.load(a), data2=nl.load(b), op=nl.add)


@nki.jit
def k_psum_both():
    p1 = psum((128, 8))
    p2 = psum((128, 8))
    nisa.memset(dst=p1, value=0.0)
    nisa.memset(dst=p2, value=0.0)
    nisa.tensor_tensor(dst=sbuf((128, 8)), data1=p1, data2=p2, op=nl.add)


@nki.jit
def k_unbroadcast(a, b):
    nl.subtract(nl.load(a), nl.load(b))


@nki.jit
def k_unsupported_op(a):
    t = nl.load(a)
    nisa.tensor_tensor(dst=sbuf((128, 8)), data1=t, data2=t, op=nl.exp)


@nki.jit
def k_operand_shape(a):
    t = nl.load(a)
    nisa.tensor_scalar(dst=sbuf((128, 8)), data=t, op0=nl.multiply, operand0=sbuf((128, 2)))


@nki.jit
def k_operand_dtype(a):
    t = nl.load(a)
    nisa.tensor_scalar(dst=sbuf((128, 8)), data=t, op0=nl.multiply,
                       operand0=sbuf((128, 1), dtype=nl.bfloat16))


@nki.jit
def k_operand_type(a):
    nisa.tensor_copy(dst=np.zeros((128, 8), F32), src=nl.load(a))


@nki.jit
def k_activation_bias(a):
    t = nl.load(a)
    nisa.activation(dst=sbuf((128, 8)), op=nl.exp, data=t, bias=1.0)


@nki.jit
def k_partition_reduce(a):
    nisa.tensor_reduce(dst=sbuf((1, 8)), op=nl.add, data=nl.load(a), axis=0)


@nki.jit
def k_nl_sum_partition(a):
    nl.sum(nl.load(a), axis=(0, 1))


@nki.jit
def k_reduce_axis(a):
    nisa.tensor_reduce(dst=sbuf((128, 8)), op=nl.add, data=nl.load(a), axis=1)


@nki.jit
def k_reduce_shape(a):
    nisa.tensor_reduce(dst=sbuf((128, 2)), op=nl.add, data=nl.load(a), axis=1)


@nki.jit
def k_memset_type():
    nisa.memset(dst=nl.ndarray((128, 8), dtype=nl.int32, buffer=nl.sbuf), value=1.5)


@nki.jit
def k_hbm_operand(a):
    t = nl.load(a)
    nisa.tensor_tensor(dst=sbuf((128, 8)), data1=t, data2=a, op=nl.add)


@nki.jit
def k_broadcast_shape(a):
    nl.broadcast_to(nl.load(a), shape=(4, 4))


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
def k_power_reduce(a):
    nisa.tensor_reduce(dst=sbuf((128, 1)), op=nl.power, data=nl.load(a), axis=1)


@nki.jit
def k_equal_unbroadcast(a, b):
    nl.equal(nl.load(a), nl.load(b))


@nki.jit
def k_equal_no_tile():
    nl.equal(1.0, 1.0)


# ---- kernel interface -----------------------------------------------------------------------

@nki.jit
def k_return_sbuf(a):
    return nl.load(a)


@nki.jit
def k_return_private_hbm(a):
    out = nl.ndarray((4, 4), dtype=nl.float32, buffer=nl.hbm)
    nisa.dma_copy(dst=out, src=a)
    return out


@nki.jit
def k_return_int(a):
    return 3


@nki.jit
def k_keyword_only(a, *, n=2):
    return a


CASES = [
    # (kernel, args, rule id, text that must appear: the offending shape or value)
    (k_partition_limit, (), "partition-limit", "(256, 4)"),
    (k_load_1d, (arr(200),), "partition-limit", "(200,)"),
    (k_partition_step, (arr(128, 4),), "partition-step", "(128, 4)"),
    (k_partition_reshape, (arr(128, 4),), "partition-reshape", "(64, 8)"),
    (k_reshape, (arr(4, 6),), "reshape", "(4, 6)"),
    (k_index_bounds, (arr(128, 4),), "index-bounds", "(128, 4)"),
    (k_index_pattern, (arr(8, 8),), "index-pattern", "(8, 8)"),
    (k_index_type, (arr(8, 8),), "index-type", "'rows'"),
    (k_index_rank, (arr(8, 8),), "index-rank", "(8, 8)"),
    (k_shape, (), "shape", "(0, 4)"),
    (k_buffer_name, (), "buffer-name", "(4, 4)"),
    (k_identity, (np.zeros((3, 4)),), "no-fp64", "(3, 4)"),
    (k_identity, (np.zeros((3, 4), dtype=np.int64),), "unsupported-dtype", "(3, 4)"),
    (k_bad_dtype, (), "unsupported-dtype", "'float32'"),
    (k_no_assign, (arr(4, 4),), "no-assign", "(4, 4)"),
    (k_store_psum, (arr(4, 4),), "dma-from-psum", "(4, 4)"),
    (k_dma_copy_psum, (arr(4, 4),), "dma-from-psum", "(4, 4)"),
    (k_dma_to_psum, (arr(4, 4),), "dma-to-psum", "(4, 4)"),
    (k_dma_count, (arr(4, 8),), "dma-count", "(4, 8)"),
    (k_load_source, (arr(4, 4),), "load-source", "(4, 4)"),
    (k_store_destination, (arr(4, 4),), "store-destination", "(4, 4)"),
    (k_store_source, (arr(4, 4),), "store-source", "(4, 4)"),
    (k_raw_enum, (arr(4, 4),), "raw-enum", "dge_mode"),
    (k_matmul_m, (arr(64, 256), arr(64, 64)), "matmul-limit", "M=256"),
    (k_matmul_n, (arr(64, 64), arr(64, 1024)), "matmul-limit", "N=1024"),
    (k_matmul_buffer, (arr(64, 64), arr(64, 64)), "matmul-buffer", "(64, 64)"),
    (k_matmul_dst_sbuf, (arr(64, 64), arr(64, 64)), "matmul-buffer", "(64, 64)"),
    (k_matmul_dtype, (arr(64, 64), arr(64, 64)), "matmul-dtype", "(64, 64)"),
    (k_matmul_shape, (arr(64, 64), arr(32, 64)), "matmul-shape", "(32, 64)"),
    (k_transpose_limit, (arr(128, 256),), "transpose-limit", "(128, 256)"),
    (k_transpose_buffer, (arr(64, 32),), "transpose-buffer", "(32, 64)"),
    (k_transpose_shape, (arr(32, 64),), "transpose-shape", "(64, 64)"),
    (k_transpose_dtype, (arr(64, 32),), "transpose-dtype", "(32, 64)"),
    (k_unsupported, (arr(64, 64), arr(64, 64)), "unsupported", "is_transpose"),
    (k_psum_uninitialized, (), "psum-uninitialized", "(128, 512)"),
    (k_psum_accumulate_unwritten, (arr(64, 64), arr(64, 64)), "psum-uninitialized", "(64, 64)"),
    (k_psum_bank, (), "psum-bank", "(128, 1024)"),
    (k_psum_banks_live, (), "psum-banks-live", "(128, 512)"),
    (k_sbuf_capacity, (), "sbuf-capacity", "(128, 32768)"),
    (k_sbuf_tile_too_big, (), "sbuf-capacity", "(128, 50000)"),
    (k_tensor_divide, (arr(128, 8),), "tensor-divide", "(128, 8)"),
    (k_nl_divide, (arr(128, 8),), "tensor-divide", "(128, 8)"),
    (k_np_divide, (arr(128, 8),), "tensor-divide", "(128, 8)"),
    (k_raw_engine, (arr(128, 8),), "raw-enum", "engine"),
    (k_partition_mismatch, (arr(128, 8), arr(64, 8)), "partition-mismatch", "(128, 8)"),
    (k_free_size_mismatch, (arr(128, 8), arr(128, 16)), "free-size-mismatch", "(128, 16)"),
    (k_psum_both, (), "psum-both", "(128, 8)"),
    (k_unbroadcast, (arr(1, 1), arr(128, 1)), "unbroadcast", "(128, 1)"),
    (k_unsupported_op, (arr(128, 8),), "unsupported-op", "nl.exp"),
    (k_operand_shape, (arr(128, 8),), "operand-shape", "(128, 2)"),
    (k_operand_dtype, (arr(128, 8),), "operand-dtype", "(128, 1)"),
    (k_operand_type, (arr(128, 8),), "operand-type", "ndarray"),
    (k_activation_bias, (arr(128, 8),), "activation-bias", "(128, 1)"),
    (k_partition_reduce, (arr(128, 8),), "partition-reduce", "(128, 8)"),
    (k_nl_sum_partition, (arr(128, 8),), "partition-reduce", "(128, 8)"),
    (k_reduce_axis, (arr(128, 4, 8),), "reduce-axis", "(128, 4, 8)"),
    (k_reduce_shape, (arr(128, 8),), "reduce-shape", "(128, 2)"),
    (k_memset_type, (), "memset-type", "(128, 8)"),
    (k_hbm_operand, (arr(128, 8),), "hbm-operand", "(128, 8)"),
    (k_broadcast_shape, (arr(2, 3),), "broadcast-shape", "(2, 3)"),
    (k_is, (arr(4, 4),), "is-operator", "`is` in k_is"),
    (k_is_in_helper, (arr(4, 4),), "is-operator", "`is not` in is_set"),
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
    (k_power_reduce, (arr(128, 8),), "unsupported-op", "nl.power"),
    (k_equal_unbroadcast, (arr(1, 1), arr(128, 1)), "unbroadcast", "(128, 1)"),
    (k_equal_no_tile, (), "operand-type", "nl.equal"),
    (k_return_sbuf, (arr(4, 4),), "output-buffer", "(4, 4)"),
    (k_return_private_hbm, (arr(4, 4),), "output-buffer", "(4, 4)"),
    (k_return_int, (arr(4, 4),), "output-type", "int"),
    (k_identity, ([1.0, 2.0],), "list-argument", "'a'"),
    (k_identity, (object(),), "argument-type", "'a'"),
    (k_keyword_only, (arr(4, 4),), "kernel-signature", "'n'"),
]


@pytest.mark.parametrize(
    "kernel, args, rule, text", CASES,
    ids=[f"{c[2]}-{c[0].__name__}" for c in CASES])
def test_rule_violation_is_reported(kernel, args, rule, text):
    with pytest.raises(NKIRuleError) as info:
        simulate(kernel)(*args)
    message = str(info.value)
    assert message.startswith(f"[{rule}]"), message
    assert info.value.rule == rule
    assert text in message, message


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
