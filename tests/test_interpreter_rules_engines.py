"""Rules of the NKI interpreter on the compute engines: the Tensor Engine (matmul, transpose)
and the Vector / Scalar engines; each triggered by a small deliberately wrong kernel."""

from __future__ import annotations

import numpy as np
import pytest

# importing interpreter_rule_helpers installs the interpreter as nki (or skips the module)
from interpreter_rule_helpers import arr, assert_rule_violation, F32, psum, sbuf

import nki
import nki.isa as nisa
import nki.language as nl


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
def k_transpose_nonfinite(a):
    nisa.nc_transpose(dst=psum((8, 32)), data=nl.load(a))


@nki.jit
def k_transpose_dtype(a):
    nisa.nc_transpose(dst=psum((32, 64)), data=nl.load(a, dtype=nl.bfloat16))


@nki.jit
def k_unsupported(a, b):
    ps = psum((64, 64))
    nisa.nc_matmul(ps, nl.load(a), nl.load(b), is_transpose=True)


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
def k_memset_out_of_range():
    nisa.memset(dst=nl.ndarray((128, 8), dtype=nl.int8, buffer=nl.sbuf), value=300)


@nki.jit
def k_hbm_operand(a):
    t = nl.load(a)
    nisa.tensor_tensor(dst=sbuf((128, 8)), data1=t, data2=a, op=nl.add)


@nki.jit
def k_broadcast_shape(a):
    nl.broadcast_to(nl.load(a), shape=(4, 4))


@nki.jit
def k_tensor_scalar_divide(a):
    nisa.tensor_scalar(dst=sbuf((128, 8)), data=nl.load(a), op0=nl.divide, operand0=3.0)


@nki.jit
def k_nl_divide_scalar(a):
    nl.divide(nl.load(a), 3.0)


@nki.jit
def k_int32_overflow(a):
    t = nl.load(a)
    nisa.tensor_tensor(dst=nl.ndarray((128, 8), dtype=nl.int32, buffer=nl.sbuf), data1=t,
                       data2=t, op=nl.multiply)


@nki.jit
def k_negative_axis(a):
    nl.sum(nl.load(a), axis=-1)


# ---- start partition of a compute-engine access (all engines) ----------------------------------

@nki.jit
def k_start_partition_vector(a):
    t = nl.load(a)
    nisa.tensor_copy(dst=sbuf((16, 8)), src=t[16:32])


@nki.jit
def k_start_partition_shift(a):
    t = nl.load(a)
    nisa.tensor_tensor(dst=sbuf((127, 8)), data1=t[1:128], data2=t[0:127], op=nl.add)


@nki.jit
def k_start_partition_scalar(a):
    nisa.activation(dst=sbuf((32, 8)), op=nl.exp, data=nl.load(a)[8:40])


@nki.jit
def k_start_partition_gpsimd(a):
    t = nl.ndarray((128, 8), dtype=nl.float32, buffer=nl.sbuf)
    nisa.memset(dst=t[16:48], value=0.0, engine=nisa.engine.gpsimd)


@nki.jit
def k_start_partition_operand(a, col):
    nisa.tensor_scalar(dst=sbuf((32, 8)), data=nl.load(a)[0:32], op0=nl.add,
                       operand0=nl.load(col)[4:36])


@nki.jit
def k_start_partition_tensor_engine(a, b):
    nisa.nc_matmul(dst=psum((64, 64)), stationary=nl.load(a)[32:96],
                   moving=nl.load(b)[32:96], accumulate=False)


@nki.jit
def k_start_partition_matmul_row_tile(a, b):
    nisa.nc_matmul(dst=psum((64, 64)), stationary=nl.load(a)[64:128],
                   moving=nl.load(b)[64:128], accumulate=False)


@nki.jit
def k_start_partition_pe_transpose(a):
    nisa.nc_transpose(dst=psum((8, 32)), data=nl.load(a)[32:64])


@nki.jit
def k_start_partition_placed(a):
    t = nl.ndarray((32, 8), dtype=nl.float32, buffer=nl.sbuf, address=(16, 0))
    nisa.memset(dst=t, value=0.0)


CASES = [
    # (kernel, args, rule id, text that must appear: the offending shape or value)
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
    (k_transpose_nonfinite, (np.where(arr(32, 8) == 3, np.inf, arr(32, 8)).astype(F32),),
     "transpose-nonfinite", "data (32, 8) holding NaN or Inf"),
    (k_unsupported, (arr(64, 64), arr(64, 64)), "unsupported", "is_transpose"),
    (k_tensor_divide, (arr(128, 8),), "tensor-divide", "(128, 8)"),
    (k_nl_divide, (arr(128, 8),), "tensor-divide", "(128, 8)"),
    (k_np_divide, (arr(128, 8),), "tensor-divide", "(128, 8)"),
    (k_tensor_scalar_divide, (arr(128, 8),), "scalar-divide", "op0=nl.divide"),
    (k_nl_divide_scalar, (arr(128, 8),), "scalar-divide", "(128, 8)"),
    (k_int32_overflow, (np.full((128, 8), 2**20, np.int32),), "integer-overflow", "nl.int32"),
    (k_negative_axis, (arr(128, 8),), "reduce-axis", "negative axes are not supported"),
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
    (k_memset_out_of_range, (), "memset-type", "300, outside nl.int8 (-128 .. 127)"),
    (k_hbm_operand, (arr(128, 8),), "hbm-operand", "(128, 8)"),
    (k_broadcast_shape, (arr(2, 3),), "broadcast-shape", "(2, 3)"),
    (k_start_partition_vector, (arr(128, 8),), "start-partition",
     "src (16, 8) starts at partition 16 of its tile; on NeuronCore-v2 a compute-engine access "
     "of 16 partitions starts at partition 0, 32, 64 or 96"),
    (k_start_partition_shift, (arr(128, 8),), "start-partition",
     "data1 (127, 8) starts at partition 1 of its tile"),
    (k_start_partition_scalar, (arr(128, 8),), "start-partition",
     "data (32, 8) starts at partition 8"),
    (k_start_partition_gpsimd, (arr(128, 8),), "start-partition",
     "dst (32, 8) starts at partition 16"),
    (k_start_partition_operand, (arr(128, 8), arr(128, 1)), "start-partition",
     "operand0 (32, 1) starts at partition 4"),
    (k_start_partition_tensor_engine, (arr(128, 64), arr(128, 64)), "start-partition",
     "stationary (64, 64) starts at partition 32 of its tile; on NeuronCore-v2 a compute-engine "
     "access of 64 partitions starts at partition 0 or 64"),
    (k_start_partition_matmul_row_tile, (arr(128, 64), arr(128, 64)), "start-partition",
     "stationary (64, 64) starts at partition 64 of its tile; a Tensor Engine input starts at "
     "partition 0"),
    (k_start_partition_pe_transpose, (arr(128, 8),), "start-partition",
     "data (32, 8) starts at partition 32 of its tile; a Tensor Engine input starts at "
     "partition 0"),
    (k_start_partition_placed, (arr(4, 4),), "start-partition",
     "dst (32, 8) starts at partition 16 (its tile is placed at partition 16)"),
]


@pytest.mark.parametrize(
    "kernel, args, rule, text", CASES,
    ids=[f"{c[2]}-{c[0].__name__}" for c in CASES])
def test_rule_violation_is_reported(kernel, args, rule, text):
    assert_rule_violation(kernel, args, rule, text)
