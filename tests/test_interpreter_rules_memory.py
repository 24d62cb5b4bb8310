"""Rules of the NKI interpreter on memory: allocation, shapes and indexing, DMA, PSUM and SBUF
capacity and initialisation, and the kernel interface; each triggered by a small deliberately
wrong kernel."""

from __future__ import annotations

import numpy as np
import pytest

# importing interpreter_rule_helpers installs the interpreter as nki (or skips the module)
from interpreter_rule_helpers import arr, assert_rule_violation, out_like, psum, sbuf

import nki
import nki.isa as nisa
import nki.language as nl


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


@nki.jit
def k_psum_banks_live_before_hbm(a):
    tiles = [nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.psum) for _ in range(9)]
    nl.ndarray((4, 4), dtype=nl.float32, buffer=nl.shared_hbm)  # checks the 9th bank
    del tiles  # nothing after the HBM allocation sees the 9 banks


@nki.jit
def k_sbuf_capacity_at_exit(a):
    out = nl.ndarray((4, 4), dtype=nl.float32, buffer=nl.shared_hbm)
    nl.store(out, nl.load(a))
    x = nl.ndarray((128, 40000), dtype=nl.float32, buffer=nl.sbuf)  # noqa: F841 - live
    y = nl.ndarray((128, 40000), dtype=nl.float32, buffer=nl.sbuf)  # noqa: F841 - last word
    return out


@nki.jit
def k_return_input(a):
    return a


@nki.jit
def k_half_written_output(a):
    out = nl.ndarray((8, 4), dtype=nl.float32, buffer=nl.shared_hbm)
    nl.store(out[0:4, 0:4], nl.load(a))
    return out


@nki.jit
def k_hbm_scratch_unwritten(a):
    out = out_like((4, 4))
    scratch = nl.ndarray((4, 4), dtype=nl.float32, buffer=nl.hbm)
    nl.store(out, nl.load(scratch))
    return out


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
    (k_psum_uninitialized, (), "psum-uninitialized", "(128, 512)"),
    (k_psum_accumulate_unwritten, (arr(64, 64), arr(64, 64)), "psum-uninitialized", "(64, 64)"),
    (k_psum_bank, (), "psum-bank", "(128, 1024)"),
    (k_psum_banks_live, (), "psum-banks-live", "(128, 512)"),
    (k_sbuf_capacity, (), "sbuf-capacity", "(128, 32768)"),
    (k_sbuf_tile_too_big, (), "sbuf-capacity", "(128, 50000)"),
    (k_psum_banks_live_before_hbm, (arr(4, 4),), "psum-banks-live", "9 PSUM banks"),
    (k_sbuf_capacity_at_exit, (arr(4, 4),), "sbuf-capacity", "(128, 40000)"),
    (k_return_input, (arr(4, 4),), "output-buffer", "kernel input"),
    (k_half_written_output, (arr(4, 4),), "output-unwritten", "(8, 4)"),
    (k_hbm_scratch_unwritten, (arr(4, 4),), "hbm-uninitialized", "(4, 4)"),
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
    assert_rule_violation(kernel, args, rule, text)
