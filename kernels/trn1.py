"""trn1 (NeuronCore-v2) capacities and the tile and strip sizes of our NKI kernels.

The single source of these numbers for three readers: the kernel sources under
``kernels/nki/`` (which import them as module constants), the host code that plans launches
(``kernels/nki_host/``), and the interpreter that checks kernels against the hardware
(``kernels/nki/interpreter/``). Plain Python ints, no ``nki`` import, so every reader can
import it whether or not NKI is installed.

Hardware facts are from the public NKI 0.3.0 documentation (Neuron SDK 2.29: the
Trainium/Inferentia2 architecture guide for NKI and the ``nki.isa`` / ``nki.language`` API
reference), as stated with their sources under "Capacity", "Instructions" and "Engines" in
the section "The NKI 0.3.0 facts the kernels and the interpreter rely on" of docs/kernels.md;
the budgets below them are our choices, sized so that the kernels fit those capacities.
"""
from __future__ import annotations

# ---- NeuronCore-v2 hardware ---------------------------------------------------------------
NEURON_CORE_VERSION = 2  # trn1; trn2 is v3 (hardware DGE and some instructions need v3+)

PARTITIONS = 128  # SBUF and PSUM partitions (dim 0 of every on-chip tile)
SBUF_BYTES_PER_PARTITION = 192 * 1024
PSUM_BANKS = 8  # accumulation groups live at once
PSUM_BANK_BYTES = 2 * 1024  # per partition; one matmul output fits one bank
PSUM_BYTES_PER_PARTITION = PSUM_BANKS * PSUM_BANK_BYTES
FP32_BYTES = 4

# nc_matmul: dst[M, N] = stationary[K, M]^T @ moving[K, N]
MATMUL_K_MAX = 128  # contraction: partitions of both inputs
MATMUL_M_MAX = 128  # stationary free size (gemm_stationary_fmax)
MATMUL_N_MAX = 512  # moving free size (gemm_moving_fmax): one fp32 PSUM bank
PE_TRANSPOSE_MAX = 128  # Tensor Engine nc_transpose, per side
VECTOR_TRANSPOSE_MAX = 32  # Vector Engine nc_transpose, per side
# A compute-engine instruction reads or writes an on-chip tensor of n partitions only from a
# start partition that is a multiple of the step for n: (largest n, step) from the smallest n up.
# So more than 64 partitions start at 0, 33..64 at 0 or 64, up to 32 at 0, 32, 64 or 96.
ENGINE_START_PARTITION_STEPS = ((32, 32), (64, 64), (PARTITIONS, PARTITIONS))

# ---- tile sizes of our kernels ------------------------------------------------------------
TILE = 128  # partition tile: K and M of a matmul, row blocks, a-tiles of T, transposes
TILE_N = 512  # moving / output columns of a matmul: one fp32 PSUM bank (= MATMUL_N_MAX)

# ---- strip budgets (bytes per partition of SBUF) --------------------------------------------
# gemm / syrk: the whole (K, N) moving strip stays resident
GEMM_STRIP_BYTES = 96 * 1024
# gemm_kernel / syrk_kernel output columns per launch: one PSUM bank per 512 columns of a
# 128-row block, two live banks
GEMM_MAX_N = 2 * TILE_N
# transform gemm (split): b, its head and its tail resident, so each gets a third
SPLIT_STRIP_BYTES = GEMM_STRIP_BYTES // 3
# same-spin fused energy: one orbital's (naux, nvir) strip of b_row and of b_col, each
ENERGY_STRIP_BYTES = 48 * 1024
# opposite-spin fused energy: the b_col block plus one 128-column b_row strip
OS_STRIP_BYTES = 96 * 1024
# opposite-spin fused energy: T tiles (PSUM banks) accumulating side by side per stationary
OS_COL_GROUP = 4
# opposite-spin energy columns per launch: one row tile keeps OS_COL_GROUP banks of 512
OS_MAX_COLS = OS_COL_GROUP * TILE_N
# trsm: the solved row blocks of one 512-column strip stay resident, 2 KiB each per partition
TRSM_MAX_N = 10240
