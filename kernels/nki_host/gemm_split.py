"""Host side of gemm_split_kernel (kernels/nki/gemm_split.py): a @ b with an fp32 Tensor
Engine but nearly fp64 accuracy, for the DF transform (the ``transform_gemm`` kernel-set method).

Why: in the two transform gemms C_occ^T (P|mu nu) and (P|i nu) C_vir the fp32 partial sums
cancel by a factor of several hundred on diffuse bases (|C_vir| reaches ~20 when the AO basis
is nearly linearly dependent), and the fit through an ill-conditioned metric amplifies the
rounding into microhartree errors (docs/kernels.md, "Accuracy of the DF transform").

The host sends the fp32 operands, as for gemm_kernel, plus one sigma per line of each operand;
the kernel splits each operand into an exact head of ``beta`` bits and a tail, forms the head
product exactly and the tail products in fp32, and returns both; the host adds them in fp64.
Launches, padding and signatures follow the plain gemm (kernels/nki_host/planner.py), with
the resident strip a third as wide (b, its head and its tail stay in SBUF).
"""
from __future__ import annotations

import math

import numpy as np

from kernels.nki.launcher import Launcher
from kernels.nki_host.arrays import block, padded
from kernels.nki_host.planner import GEMM_MAX_K, split_matmul_plan

FP32_SIGNIFICAND_BITS = 24
# Heads of at most 8 bits are exact bf16 values: the head products stay exact however the
# Tensor Engine forms fp32 products (from bf16 pieces or not).
MAX_HEAD_BITS = 8
# Lines whose largest magnitude is below this are treated as zero lines: their heads are 0.
ZERO_LINE = 2.0 ** -100


def head_bits(k: int) -> int:
    """Bits per head so that k head products sum exactly in fp32: 2*beta + ceil(log2 k) <= 24,
    and at most MAX_HEAD_BITS."""
    return min(MAX_HEAD_BITS, (FP32_SIGNIFICAND_BITS - math.ceil(math.log2(max(2, k)))) // 2)


def line_sigmas(x: np.ndarray, beta: int, axis: int) -> np.ndarray:
    """The splitting constant of every line of fp32 ``x`` as a (1, lines) fp32 row:
    1.5 * 2^(e + 23 - beta) with 2^e >= max |x| over the line (``axis`` is the contraction
    axis: 1 for the rows of a left factor, 0 for the columns of a right one). Adding and
    subtracting it rounds the line onto the grid 2^(e - beta): beta bits per head."""
    amax = np.max(np.abs(x), axis=axis).astype(np.float64)
    live = amax >= ZERO_LINE
    exponent = np.ceil(np.log2(np.where(live, amax, 1.0))).astype(np.int64)
    exponent = np.where(live, exponent, -100)
    sigma = np.ldexp(1.5, exponent + FP32_SIGNIFICAND_BITS - 1 - beta)
    return sigma.astype(np.float32).reshape(1, -1)


def split_matmul(launcher: Launcher, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``a @ b`` in fp64 for fp32 a (m, k) and b (k, n): head + tail of gemm_split_kernel
    launches, summed (with the K chunks) on the host in fp64."""
    m, k = a.shape
    n = b.shape[1]
    if m == 0 or n == 0 or k == 0:
        return np.zeros((m, n))
    beta = head_bits(min(k, GEMM_MAX_K))  # terms one launch adds up
    plan = split_matmul_plan(m, k, n)
    a_pad = padded(np.ascontiguousarray(a.T), plan.k.padded, plan.m.padded)
    b_pad = padded(b, plan.k.padded, plan.n.padded)
    sa = padded(line_sigmas(a, beta, axis=1), 1, plan.m.padded)
    sb = padded(line_sigmas(b, beta, axis=0), 1, plan.n.padded)
    out = np.zeros((plan.m.padded, plan.n.padded))
    for k0 in plan.k.starts:
        ks = slice(k0, k0 + plan.k.chunk)
        for m0 in plan.m.starts:
            ms = slice(m0, m0 + plan.m.chunk)
            a_chunk = block(a_pad, ks, ms)
            sa_chunk = block(sa, slice(0, 1), ms)
            for n0 in plan.n.starts:
                ns = slice(n0, n0 + plan.n.chunk)
                head, tail = launcher.run("gemm_split", a_chunk, block(b_pad, ks, ns), sa_chunk,
                                          block(sb, slice(0, 1), ns))
                out[ms, ns] += head.astype(np.float64) + tail.astype(np.float64)
    return out[:m, :n]


def exact_input_matmul(launcher: Launcher, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``a @ b`` in fp64 for fp64 a (m, k) and b (k, n): each operand is its fp32 rounding
    (hi) plus the fp32 remainder (lo), and hi @ hi, hi @ lo and lo @ hi are split products
    (the same launches' shapes, so no new kernel signature to compile). Rounding the fp64
    operands to fp32 alone moved (P|ia) by 6e-5 for H2 in aug-cc-pV5Z (|C_vir| near 200) and
    E_corr by 2.6e-6 Eh; lo @ lo is 2^-48 of the product."""
    a_hi, b_hi = a.astype(np.float32), b.astype(np.float32)
    a_lo = (a - a_hi).astype(np.float32)
    b_lo = (b - b_hi).astype(np.float32)
    product = split_matmul(launcher, a_hi, b_hi)
    if b_lo.any():
        product += split_matmul(launcher, a_hi, b_lo)
    if a_lo.any():
        product += split_matmul(launcher, a_lo, b_hi)
    return product


def transform_gemm(launcher: Launcher, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``a @ b`` in fp64 of fp64 operands, with gemm's operand shapes: a (..., m, k) and
    b (k, n), or a (m, k) and a batch b (p, k, n) (one product on b laid out as (k, p*n))."""
    if b.ndim == 3:
        nb, k, n = b.shape
        m = a.shape[0]
        moving = np.ascontiguousarray(b.transpose(1, 0, 2).reshape(k, nb * n))
        c = exact_input_matmul(launcher, a, moving)
        return np.ascontiguousarray(c.reshape(m, nb, n).transpose(1, 0, 2))
    *batch, m, k = a.shape
    return exact_input_matmul(launcher, a.reshape(-1, k), b).reshape(*batch, m, b.shape[1])
