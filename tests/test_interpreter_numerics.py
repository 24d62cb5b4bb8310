"""Interpreter numerics: memory fill, RNE rounding of narrow types, PSUM accumulation, ops, and
the legal forms of NKI 0.3.0 that the interpreter once rejected."""

from __future__ import annotations

import numpy as np
import pytest

from kernels.nki.interpreter import NKIRuleError, Profile, install, simulate

if not install():
    pytest.skip("the real nki is installed: these tests target the interpreter",
                allow_module_level=True)

import nki  # noqa: E402
import nki.isa as nisa  # noqa: E402
import nki.language as nl  # noqa: E402

F32 = np.float32


FRESH: list = []


@nki.jit
def fresh_memory(a):
    """Outputs nothing writes: their fill is kept for the test to inspect, and returning them
    is refused (reading never-written memory is a rule error everywhere)."""
    out_f = nl.ndarray((4, 8), dtype=nl.float32, buffer=nl.shared_hbm)
    out_i = nl.ndarray((4, 8), dtype=nl.int32, buffer=nl.shared_hbm)
    FRESH[:] = [out_f.data.copy(), out_i.data.copy()]
    return out_f, out_i


def test_ndarray_is_filled_with_nan_or_4_and_an_unwritten_output_is_refused():
    with pytest.raises(NKIRuleError, match=r"^\[output-unwritten\] returned tensor \(4, 8\)"):
        simulate(fresh_memory)(np.zeros((1, 1), F32))
    out_f, out_i = FRESH
    assert np.isnan(out_f).all()
    assert out_i.dtype == np.int32 and (out_i == 4).all()


@nki.jit
def cast_roundtrip(a, dtype_name):
    """Load fp32 values as ``dtype_name`` (rounding on write), store them back to fp32."""
    out = nl.ndarray(a.shape, dtype=nl.float32, buffer=nl.shared_hbm)
    narrow = nl.load(a, dtype=getattr(nl, dtype_name))
    wide = nl.ndarray(a.shape, dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_copy(dst=wide, src=narrow)
    nl.store(out, wide)
    return out


def roundtrip(values, dtype_name):
    a = np.asarray(values, dtype=F32).reshape(1, -1)
    return simulate(cast_roundtrip)(a, dtype_name).reshape(-1)


# (value, expected) pairs; ulp(1) is 2^-7 for bf16, 2^-10 for fp16/tf32, 2^-3 / 2^-2 for fp8.
ROUNDING = {
    "bfloat16": [
        (1 + 2.0**-8, 1.0),  # exact tie -> even (1.0)
        (1 + 3 * 2.0**-8, 1 + 2.0**-6),  # exact tie -> even (1 + 2^-6)
        (1 + 2.0**-8 + 2.0**-20, 1 + 2.0**-7),  # above the tie -> up
        (-(1 + 3 * 2.0**-8), -(1 + 2.0**-6)),
        (3.0, 3.0),
    ],
    "float16": [(1 + 2.0**-11, 1.0), (1 + 3 * 2.0**-11, 1 + 2.0**-9), (70000.0, np.inf)],
    "tfloat32": [(1 + 2.0**-11, 1.0), (1 + 3 * 2.0**-11, 1 + 2.0**-9), (70000.0, 70016.0)],
    # trn1's IEEE-style E4M3: largest finite 240; 244 rounds down to it, 248 (the tie) rounds
    # to even, past 240, and overflows to inf like everything above (no e4m3fn 256..448).
    "float8_e4m3": [(1 + 2.0**-4, 1.0), (1 + 3 * 2.0**-4, 1.25), (240.0, 240.0),
                    (244.0, 240.0), (248.0, np.inf), (256.0, np.inf), (448.0, np.inf),
                    (-500.0, -np.inf), (2.0**-9, 2.0**-9)],
    "float8_e5m2": [(1 + 2.0**-3, 1.0), (1 + 3 * 2.0**-3, 1.5), (1e6, np.inf)],
}


@pytest.mark.parametrize("dtype_name", sorted(ROUNDING))
def test_round_to_nearest_even_on_write(dtype_name):
    values, expected = zip(*ROUNDING[dtype_name])
    np.testing.assert_array_equal(roundtrip(values, dtype_name), np.asarray(expected, F32))


def test_nan_survives_narrowing():
    assert np.isnan(roundtrip([np.nan], "bfloat16")).all()


def test_bf16_rounding_matches_torch():
    torch = pytest.importorskip("torch")
    x = np.random.default_rng(1).standard_normal(4096).astype(F32) * 1000
    expected = torch.from_numpy(x).to(torch.bfloat16).to(torch.float32).numpy()
    np.testing.assert_array_equal(roundtrip(x, "bfloat16"), expected)


@nki.jit
def to_int(a, dtype_name):
    out = nl.ndarray(a.shape, dtype=getattr(nl, dtype_name), buffer=nl.shared_hbm)
    t = nl.ndarray(a.shape, dtype=getattr(nl, dtype_name), buffer=nl.sbuf)
    nisa.tensor_copy(dst=t, src=nl.load(a))
    nl.store(out, t)
    return out


def test_float_to_int_rounds_half_even_and_saturates():
    a = np.array([[2.5, 3.5, -1.5, 300.0, -300.0]], F32)
    np.testing.assert_array_equal(simulate(to_int)(a, "int32"), [[2, 4, -2, 300, -300]])
    np.testing.assert_array_equal(simulate(to_int)(a, "int8"), [[2, 4, -2, 127, -128]])


@nki.jit
def psum_modes(a_t, b, mode):
    """Two matmuls into one PSUM tile with accumulate settings chosen by ``mode``."""
    out = nl.ndarray((a_t.shape[1], b.shape[1]), dtype=nl.float32, buffer=nl.shared_hbm)
    lhs = nl.load(a_t)
    rhs = nl.load(b)
    ps = nl.ndarray((a_t.shape[1], b.shape[1]), dtype=nl.float32, buffer=nl.psum)
    if mode == "false":
        nisa.nc_matmul(ps, lhs, rhs, accumulate=False)
        nisa.nc_matmul(ps, lhs, rhs, accumulate=False)
    elif mode == "explicit":
        nisa.nc_matmul(dst=ps, stationary=lhs, moving=rhs, accumulate=False)
        nisa.nc_matmul(dst=ps, stationary=lhs, moving=rhs, accumulate=True)
    elif mode == "none":
        for _ in nl.affine_range(3):
            nisa.nc_matmul(ps, lhs, rhs)
    elif mode == "partial":  # top half matmul-written: it accumulates, bottom half is overwritten
        nisa.nc_matmul(ps[0:2, :], lhs[:, 0:2], rhs, accumulate=False)
        nisa.nc_matmul(ps, lhs, rhs)
    res = nl.ndarray(ps.shape, dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_copy(dst=res, src=ps)
    nl.store(out, res)
    return out


@pytest.mark.parametrize("mode, expected", [
    ("false", lambda p: p),
    ("explicit", lambda p: 2 * p),
    ("none", lambda p: 3 * p),
    ("partial", lambda p: p + np.vstack([p[0:2], np.zeros_like(p[2:])])),
])
def test_psum_accumulate_semantics(mode, expected):
    rng = np.random.default_rng(2)
    a_t = rng.integers(-3, 4, (8, 4)).astype(F32)
    b = rng.integers(-3, 4, (8, 6)).astype(F32)
    np.testing.assert_array_equal(simulate(psum_modes)(a_t, b, mode), expected(a_t.T @ b))


@nki.jit
def vector_ops(a, col):
    """A tour of the vector / scalar instructions and nl helpers; one output per result."""
    x = nl.load(a)
    c = nl.load(col)
    outs = []

    def emit(tile):
        o = nl.ndarray(tile.shape, dtype=nl.float32, buffer=nl.shared_hbm)
        nl.store(o, tile)
        outs.append(o)

    t = nl.ndarray(x.shape, dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_scalar(dst=t, data=x, op0=nl.subtract, operand0=c, reverse0=True,
                       op1=nl.multiply, operand1=2.0)
    emit(t)
    t = nl.ndarray(x.shape, dtype=nl.float32, buffer=nl.sbuf)
    nisa.activation(dst=t, op=nl.exp, data=x, bias=c, scale=0.5)
    emit(t)
    r = nl.ndarray((x.shape[0], 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_reduce(dst=r, op=nl.max, data=x, axis=1, keepdims=True, negate=True)
    emit(r)
    t = nl.ndarray(x.shape, dtype=nl.float32, buffer=nl.sbuf)
    nisa.reciprocal(dst=t, data=x)
    emit(t)
    emit(nl.multiply(x, nl.reciprocal(x)))
    emit(nl.sum(nl.square(x), axis=1, keepdims=True))
    emit(nl.add(nl.broadcast_to(nl.load(a[0:1, 0:1]), shape=(x.shape[0], 1)), c))
    emit(nl.maximum(x, 1.5))
    emit(nl.subtract(1.0, x))
    return tuple(outs)


def test_vector_and_scalar_engine_ops():
    a = np.array([[1.0, 2.0, 4.0], [0.5, 8.0, 3.0]], F32)
    col = np.array([[1.0], [-1.0]], F32)
    res = simulate(vector_ops)(a, col)
    np.testing.assert_allclose(res[0], (col - a) * 2)
    np.testing.assert_allclose(res[1], np.exp(a * 0.5 + col), rtol=1e-6)
    np.testing.assert_allclose(res[2], -a.max(axis=1, keepdims=True))
    np.testing.assert_allclose(res[3], 1 / a)
    np.testing.assert_allclose(res[4], np.ones_like(a))
    np.testing.assert_allclose(res[5], (a * a).sum(axis=1, keepdims=True))
    np.testing.assert_allclose(res[6], a[0, 0] + col)
    np.testing.assert_allclose(res[7], np.maximum(a, 1.5))
    np.testing.assert_allclose(res[8], 1 - a)


@nki.jit
def transposes(a):
    """Each transpose path on data of a's dtype: PE nc_transpose, load_transpose2d, nl.transpose
    and the Vector Engine nc_transpose."""
    shape = (a.shape[1], a.shape[0])
    outs = (nl.ndarray(shape, dtype=a.dtype, buffer=nl.shared_hbm),
            nl.ndarray(shape, dtype=a.dtype, buffer=nl.shared_hbm),
            nl.ndarray(shape, dtype=a.dtype, buffer=nl.shared_hbm),
            nl.ndarray(shape, dtype=a.dtype, buffer=nl.shared_hbm))
    x = nl.load(a)
    ps = nl.ndarray(shape, dtype=a.dtype, buffer=nl.psum)
    nisa.nc_transpose(dst=ps, data=x)
    t = nl.ndarray(shape, dtype=a.dtype, buffer=nl.sbuf)
    nisa.tensor_copy(dst=t, src=ps)
    nl.store(outs[0], t)
    nl.store(outs[1], nl.load_transpose2d(a))
    t2 = nl.ndarray(shape, dtype=a.dtype, buffer=nl.sbuf)
    nisa.tensor_copy(dst=t2, src=nl.transpose(x))
    nl.store(outs[2], t2)
    t3 = nl.ndarray(shape, dtype=a.dtype, buffer=nl.sbuf)
    nisa.nc_transpose(dst=t3, data=x, engine=nisa.engine.vector)
    nl.store(outs[3], t3)
    return outs


def test_transposes():
    a = np.arange(24, dtype=F32).reshape(4, 6)
    for res in simulate(transposes)(a):
        np.testing.assert_array_equal(res, a.T)


def test_transposes_move_int32_values_exactly():
    """A transpose moves data of any dtype into a dst of the same dtype: int32 beyond 2^24 came
    back rounded to fp32 (2^24 + 1 as 2^24)."""
    a = np.array([[2**24 + 1, 3, -(2**31)], [5, -(2**24 + 3), 2**31 - 1]], dtype=np.int32)
    for res in simulate(transposes)(a):
        np.testing.assert_array_equal(res, a.T)


@nki.jit
def vector_transpose(a):
    out = nl.ndarray((a.shape[1], a.shape[0]), dtype=nl.float32, buffer=nl.shared_hbm)
    t = nl.ndarray((a.shape[1], a.shape[0]), dtype=nl.float32, buffer=nl.sbuf)
    nisa.nc_transpose(dst=t, data=nl.load(a), engine=nisa.engine.vector)
    nl.store(out, t)
    return out


def test_vector_engine_transposes_inf_and_nan_exactly():
    """Only the Tensor Engine's matmul-style transpose is inexact for them on NeuronCore-v2."""
    a = np.arange(24, dtype=F32).reshape(4, 6)
    a[1, 2], a[3, 0] = np.inf, np.nan
    np.testing.assert_array_equal(simulate(vector_transpose)(a), a.T)


@nki.jit
def cast_transpose(a):
    out = nl.ndarray((a.shape[1], a.shape[0]), dtype=nl.float32, buffer=nl.shared_hbm)
    t = nl.ndarray((a.shape[1], a.shape[0]), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_copy(dst=t, src=nl.transpose(nl.load(a), dtype=nl.bfloat16))
    nl.store(out, t)
    return out


def test_nl_transpose_casts_to_its_dtype():
    """The reference's nl.transpose(x, dtype=None) casts the output; a dtype other than x's
    was refused (transpose-dtype), which only nisa.nc_transpose's dst must obey."""
    a = np.array([[1 + 2**-8, 2.0], [1 + 3 * 2**-8, -3.0]], dtype=F32)
    expected = np.array([[1.0, 1 + 2**-6], [2.0, -3.0]], dtype=F32)
    np.testing.assert_array_equal(simulate(cast_transpose)(a), expected)


@nki.jit
def broadcasts(a):
    """nl.broadcast_to with a dtype, and to the shape x already has."""
    cast = nl.ndarray((4, a.shape[1]), dtype=nl.float32, buffer=nl.shared_hbm)
    same = nl.ndarray(a.shape, dtype=nl.float32, buffer=nl.shared_hbm)
    x = nl.load(a)
    nl.store(cast, nl.broadcast_to(x, (4, a.shape[1]), dtype=nl.bfloat16))
    nl.store(same, nl.broadcast_to(x, a.shape))
    return cast, same


def test_broadcast_to_casts_and_returns_a_tile_of_its_shape_unchanged():
    """The reference's nl.broadcast_to(x, shape, dtype=None): the dtype was refused (a
    TypeError), and x already of the shape was copied by a Vector Engine instruction."""
    a = np.array([[1 + 2**-8, 1 + 3 * 2**-8, 3.0]], dtype=F32)
    profile = Profile()
    cast, same = simulate(broadcasts, profile=profile)(a)
    np.testing.assert_array_equal(cast, np.repeat([[1.0, 1 + 2**-6, 3.0]], 4, axis=0))
    np.testing.assert_array_equal(same, a)
    assert profile.instructions["vector"] == 1  # the cast broadcast only


@nki.jit
def index_styles(a):
    """ds(), slices and integer indexing of a rank-3 HBM tensor (0.3.0 has no nl.arange)."""
    out = nl.ndarray((2, 4, 8), dtype=nl.float32, buffer=nl.shared_hbm)
    for b in nl.static_range(2):
        t = nl.load(a[b, nl.ds(0, 4), 0:8])
        u = nl.load(a[b, 0:4, nl.ds(8, 8)])
        nl.store(out[b], nl.add(t, u))
    return out


def test_index_styles():
    a = np.arange(2 * 4 * 16, dtype=F32).reshape(2, 4, 16)
    np.testing.assert_array_equal(simulate(index_styles)(a), a[:, :, :8] + a[:, :, 8:])


@nki.jit
def misc_ops(a, b):
    """numpy operator aliases, HBM->HBM, initialised tensors, nl.matmul."""
    sums = nl.ndarray(a.shape, dtype=nl.float32, buffer=nl.shared_hbm)
    x, y = nl.load(a), nl.load(b)
    t = nl.ndarray(a.shape, dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_tensor(dst=t, data1=x, data2=y, op=np.add)
    nisa.tensor_tensor(dst=t, data1=t, data2=nl.ones(a.shape, dtype=nl.float32), op=nl.add)
    nisa.dma_copy(dst=sums, src=t)
    copied = nl.ndarray(a.shape, dtype=nl.float32, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=copied, src=a)
    filled = nl.ndarray(a.shape, dtype=nl.int32, buffer=nl.shared_hbm)
    nl.store(filled, nl.full(a.shape, 2.5, dtype=nl.int32))
    product = nl.ndarray((a.shape[1], b.shape[1]), dtype=nl.float32, buffer=nl.shared_hbm)
    res = nl.zeros_like(nl.ndarray((a.shape[1], b.shape[1]), dtype=nl.float32), buffer=nl.sbuf)
    nisa.tensor_copy(dst=res, src=nl.matmul(x, y, transpose_x=True))
    nl.store(product, res)
    return sums, copied, filled, product


def test_misc_ops():
    a = np.arange(12, dtype=F32).reshape(3, 4)
    b = np.ones((3, 4), F32)
    sums, copied, filled, product = simulate(misc_ops)(a, b)
    np.testing.assert_array_equal(sums, a + b + 1)
    np.testing.assert_array_equal(copied, a)
    np.testing.assert_array_equal(filled, np.full((3, 4), 2, np.int32))
    np.testing.assert_allclose(product, a.T @ b)


@nki.jit
def subtract_reductions(a):
    """tensor_reduce with nl.subtract (a legal reduction operator) over one and two axes."""
    rows, mid = a.shape[0], a.shape[1]
    x = nl.load(a)
    over_last = nl.ndarray((rows, mid), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_reduce(dst=over_last, op=nl.subtract, data=x, axis=2)
    over_both = nl.ndarray((rows, 1, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_reduce(dst=over_both, op=nl.subtract, data=x, axis=(1, 2), keepdims=True)
    out_last = nl.ndarray((rows, mid), dtype=nl.float32, buffer=nl.shared_hbm)
    out_both = nl.ndarray((rows, 1, 1), dtype=nl.float32, buffer=nl.shared_hbm)
    nl.store(out_last, over_last)
    nl.store(out_both, over_both)
    return out_last, out_both


def test_tensor_reduce_subtract_folds_from_the_first_element():
    a = np.random.default_rng(5).integers(-9, 10, (4, 3, 5)).astype(F32)
    over_last, over_both = simulate(subtract_reductions)(a)
    np.testing.assert_array_equal(over_last, a[:, :, 0] - a[:, :, 1:].sum(axis=2))
    flat = a.reshape(4, -1)  # the reduced elements in row-major order
    np.testing.assert_array_equal(over_both.reshape(4), flat[:, 0] - flat[:, 1:].sum(axis=1))


@nki.jit
def placed_tile(a):
    """nl.ndarray(..., address=(partition_offset, free_offset)): explicit placement."""
    out = nl.ndarray(a.shape, dtype=nl.float32, buffer=nl.shared_hbm)
    t = nl.ndarray(a.shape, dtype=nl.float32, buffer=nl.sbuf, address=(64, 4096))
    nisa.dma_copy(dst=t, src=a)
    nisa.dma_copy(dst=out, src=t)
    return out


def test_ndarray_accepts_an_address():
    a = np.arange(64 * 8, dtype=F32).reshape(64, 8)
    np.testing.assert_array_equal(simulate(placed_tile)(a), a)


@nki.jit
def moves_between_allowed_starts(a, b):
    """Engine accesses from the start partitions NeuronCore-v2 allows for their partition count
    (0/32/64/96 up to 32 partitions, 0/64 up to 64): the Vector Engine moves data across
    partitions between such starts, and the Tensor Engine reads operands moved to partition 0
    (a tile at partition 64 by DMA). DMA reads any partition."""
    x = nl.load(a)
    moved = nl.ndarray((128, 8), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_copy(dst=moved[0:32], src=x[96:128])
    nisa.tensor_copy(dst=moved[32:64], src=x[64:96])
    nisa.tensor_copy(dst=moved[64:128], src=x[0:64])
    placed = nl.ndarray((32, 8), dtype=nl.float32, buffer=nl.sbuf, address=(32, 0))
    nisa.tensor_tensor(dst=placed, data1=x[32:64], data2=moved[0:32], op=nl.add)
    y = nl.load(b)
    product = nl.ndarray((8, 8), dtype=nl.float32, buffer=nl.psum)
    lower = nl.ndarray((64, 8), dtype=nl.float32, buffer=nl.sbuf)
    nisa.dma_copy(dst=lower, src=y[64:128])
    nisa.nc_matmul(dst=product, stationary=lower, moving=lower, accumulate=False)
    out_moved = nl.ndarray((128, 8), dtype=nl.float32, buffer=nl.shared_hbm)
    out_placed = nl.ndarray((32, 8), dtype=nl.float32, buffer=nl.shared_hbm)
    out_product = nl.ndarray((8, 8), dtype=nl.float32, buffer=nl.shared_hbm)
    out_row = nl.ndarray((1, 8), dtype=nl.float32, buffer=nl.shared_hbm)
    nl.store(out_moved, moved)
    nisa.dma_copy(dst=out_row, src=x[17:18])
    nl.store(out_placed, placed)
    product_sb = nl.ndarray((8, 8), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_copy(dst=product_sb, src=product)
    nl.store(out_product, product_sb)
    return out_moved, out_placed, out_product, out_row


def test_engines_move_data_between_allowed_start_partitions():
    a = np.arange(128 * 8, dtype=F32).reshape(128, 8)
    b = np.random.default_rng(3).standard_normal((128, 8)).astype(F32)
    moved, placed, product, row = simulate(moves_between_allowed_starts)(a, b)
    np.testing.assert_array_equal(moved, np.concatenate([a[96:], a[64:96], a[:64]]))
    np.testing.assert_array_equal(placed, a[32:64] + a[96:])
    np.testing.assert_allclose(product, b[64:].T @ b[64:], rtol=1e-5)
    np.testing.assert_array_equal(row, a[17:18])


@nki.jit
def copy_of_psum(a_t, b):
    """nl.copy of a PSUM tile: a new tile in PSUM (NKI 0.3.0), made by one Scalar Engine
    activation; only nisa.tensor_copy then brings it to SBUF."""
    out = nl.ndarray((a_t.shape[1], b.shape[1]), dtype=nl.float32, buffer=nl.shared_hbm)
    product = nl.matmul(nl.load(a_t), nl.load(b), transpose_x=True)
    copied = nl.copy(product)
    assert copied.buffer == nl.psum
    res = nl.ndarray(copied.shape, dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_copy(dst=res, src=copied)
    nl.store(out, res)
    return out


def test_nl_copy_of_a_psum_tile():
    rng = np.random.default_rng(6)
    a_t = rng.standard_normal((32, 16)).astype(F32)
    b = rng.standard_normal((32, 24)).astype(F32)
    profile = Profile()
    np.testing.assert_allclose(simulate(copy_of_psum, profile=profile)(a_t, b), a_t.T @ b,
                               rtol=1e-5, atol=1e-5)
    assert profile.instructions["scalar"] == 1  # the copy is an activation(op=nl.copy)
    assert profile.peak_psum_banks == 2


@nki.jit
def matmul_without_transpose_x(x, y):
    """nl.matmul(x, y) = x @ y: the interpreter inserts the transpose of x, as NKI 0.3.0 does."""
    out = nl.ndarray((x.shape[0], y.shape[1]), dtype=nl.float32, buffer=nl.shared_hbm)
    res = nl.ndarray((x.shape[0], y.shape[1]), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_copy(dst=res, src=nl.matmul(nl.load(x), nl.load(y)))
    nl.store(out, res)
    return out


def test_nl_matmul_without_transpose_x():
    rng = np.random.default_rng(7)
    x = rng.standard_normal((64, 32)).astype(F32)
    y = rng.standard_normal((32, 48)).astype(F32)
    profile = Profile()
    np.testing.assert_allclose(simulate(matmul_without_transpose_x, profile=profile)(x, y), x @ y,
                               rtol=1e-5, atol=1e-5)
    assert profile.transposes == 1  # the inserted Tensor Engine transpose of x
    assert profile.instructions["tensor"] == 2 and profile.matmul_flops == 2 * 64 * 32 * 48


@nki.jit
def power_and_equal(a, b):
    x, y = nl.load(a), nl.load(b)
    results = (nl.power(x, y), nl.power(x, 2.0), nl.power(2.0, y), nl.equal(x, y),
               nl.equal(x, 3.0, dtype=nl.uint8))
    outs = []
    for tile in results:
        out = nl.ndarray(tile.shape, dtype=tile.dtype, buffer=nl.shared_hbm)
        nl.store(out, tile)
        outs.append(out)
    return tuple(outs)


def test_nl_power_and_nl_equal():
    a = np.array([[1.0, 2.0, 3.0], [4.0, 0.5, 3.0]], F32)
    b = np.array([[2.0, 2.0, 0.5], [1.0, 3.0, 3.0]], F32)
    profile = Profile()
    power_tt, power_ts, power_st, equal_tt, equal_ts = simulate(power_and_equal,
                                                                profile=profile)(a, b)
    np.testing.assert_allclose(power_tt, a ** b, rtol=1e-6)
    np.testing.assert_allclose(power_ts, a ** 2, rtol=1e-6)
    np.testing.assert_allclose(power_st, 2.0 ** b, rtol=1e-6)
    np.testing.assert_array_equal(equal_tt, (a == b).astype(F32))
    assert equal_ts.dtype == np.uint8
    np.testing.assert_array_equal(equal_ts, (a == 3.0).astype(np.uint8))
    assert profile.instructions["gpsimd"] == 1  # tile ** tile runs on GpSimd (tensor_tensor notes)


@nki.jit
def int_tensor_tensor(a, b, op_name, on_vector):
    """op(a, b) for int32/uint32 tiles, on the default engine (GpSimd) or on Vector."""
    out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
    x, y = nl.load(a), nl.load(b)
    r = nl.ndarray(a.shape, dtype=x.dtype, buffer=nl.sbuf)
    engine = nisa.engine.vector if on_vector else nisa.engine.unknown
    nisa.tensor_tensor(dst=r, data1=x, data2=y, op=getattr(nl, op_name), engine=engine)
    nl.store(out, r)
    return out


@pytest.mark.parametrize("dtype, x, y, op_name, expected", [
    (np.int32, 16777217, 0, "add", 16777217),
    (np.int32, 2**31 - 2, 1, "add", 2**31 - 1),
    (np.int32, -2**31 + 2**24 + 3, 2**24 + 1, "subtract", -2**31 + 2),
    (np.int32, 46341, 46340, "multiply", 46341 * 46340),
    (np.int32, 16777217, 16777216, "maximum", 16777217),
    (np.uint32, 2**32 - 1, 0, "add", 2**32 - 1),
    (np.uint32, 4294967290, 4294967291, "minimum", 4294967290),
])
def test_int32_tensor_tensor_on_gpsimd_is_exact(dtype, x, y, op_name, expected):
    a, b = np.full((128, 4), x, dtype), np.full((128, 4), y, dtype)
    out = simulate(int_tensor_tensor)(a, b, op_name, False)
    assert out.dtype == dtype and (out.astype(np.int64) == expected).all()


def test_int32_tensor_tensor_on_the_vector_engine_computes_in_fp32():
    a, b = np.full((128, 4), 16777217, np.int32), np.zeros((128, 4), np.int32)
    assert (simulate(int_tensor_tensor)(a, b, "add", True) == 16777216).all()


@nki.jit
def dynamic_rows(a):
    """Copy a (256, 4) tensor through SBUF in 128-row tiles indexed by a dynamic_range index."""
    out = nl.ndarray(a.shape, dtype=nl.float32, buffer=nl.shared_hbm)
    for i in nl.dynamic_range(2):
        t = nl.load(a[i * 128:(i + 1) * 128, 0:4])
        nl.store(out[nl.ds(i * 128, 128), 0:4], t)
    return out


def test_dynamic_range_index_slices_hbm_tensors():
    a = np.arange(256 * 4, dtype=F32).reshape(256, 4)
    np.testing.assert_array_equal(simulate(dynamic_rows)(a), a)


@nki.jit
def bool_roundtrip(a):
    out = nl.ndarray(a.shape, dtype=nl.bool_, buffer=nl.shared_hbm)
    flags = nl.ndarray(a.shape, dtype=nl.bool_, buffer=nl.sbuf)
    nisa.tensor_copy(dst=flags, src=nl.load(a))
    nl.store(out, flags)
    return out


def test_bool_tiles_hold_zero_or_one():
    a = np.array([[0.0, 2.5, -1.0, 0.0]], F32)
    out = simulate(bool_roundtrip)(a)
    assert out.dtype == np.bool_
    np.testing.assert_array_equal(out, [[False, True, True, False]])
