"""A first-order trn1 (NeuronCore-v2) cost model. Every number here is an assumption.

The interpreter charges each instruction a number of engine cycles as it executes; the
profile turns cycles and DMA bytes into seconds. This is an *estimate*, never a measurement.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

# Engine clock of a trn1 NeuronCore-v2: 1.4 GHz (AWS Neuron architecture docs for Trainium;
# the same clock is assumed for the Tensor, Vector, Scalar and GpSimd engines).
CLOCK_HZ = 1.4e9

# Tensor Engine peak per NeuronCore on trn1 (docs/kernels.md, "Capacity" facts):
# about 23 TFLOPS in fp32 and about 92 TFLOPS in bf16 / fp16 / tf32 (fp8 assumed the same);
# an instruction runs at the fp32 rate only when its inputs are float32.
TENSOR_FP32_FLOPS = 23e12
TENSOR_LOWP_FLOPS = 92e12

# The Tensor Engine is a 128 x 128 systolic array (nki.isa.nc_matmul docs). A matmul instruction
# occupies the whole array whatever K and M are, and streams the N moving columns through it,
# so its cost is that of a full 128 x 128 x N product: small matmuls are not free.
PE_ROWS = 128
PE_COLUMNS = 128

# Fixed cost per instruction on every compute engine: the docs' "MIN_II is roughly 64 engine
# cycles" (nki.isa instruction cost notes, e.g. activation_reduce / tensor_scalar_reduce).
INSTRUCTION_OVERHEAD_CYCLES = 64

# Vector / Scalar / GpSimd engines process about one element per partition lane per cycle,
# all partitions in parallel (nki.isa cost notes: "N elements per partition" -> ~N cycles).
ELEMENTS_PER_LANE_PER_CYCLE = 1.0

# HBM bandwidth: about 820 GB/s per trn1 chip (docs/kernels.md, "Capacity" facts); a chip has
# 2 NeuronCores and we assume each core gets half. DMA is charged by bandwidth only:
# per-transfer latency is assumed hidden by the 16 DMA queues working in parallel (an
# optimistic assumption).
HBM_BYTES_PER_SECOND_PER_CHIP = 820e9
NEURONCORES_PER_CHIP = 2
HBM_BYTES_PER_SECOND_PER_CORE = HBM_BYTES_PER_SECOND_PER_CHIP / NEURONCORES_PER_CHIP

ESTIMATE_LABEL = "estimated trn1 time (model, not measured)"

COMPUTE_ENGINES = ("tensor", "vector", "scalar", "gpsimd")
ENGINES = COMPUTE_ENGINES + ("dma",)


def matmul_cycles(moving_columns: int, low_precision: bool) -> float:
    """Tensor Engine cycles of one nc_matmul (or PE transpose) streaming ``moving_columns``."""
    peak = TENSOR_LOWP_FLOPS if low_precision else TENSOR_FP32_FLOPS
    full_array_flops = 2.0 * PE_ROWS * PE_COLUMNS * moving_columns
    return full_array_flops / (peak / CLOCK_HZ) + INSTRUCTION_OVERHEAD_CYCLES


def elementwise_cycles(elements_per_partition: int) -> float:
    """Vector / Scalar / GpSimd cycles of one instruction touching that many elements per lane."""
    return elements_per_partition / ELEMENTS_PER_LANE_PER_CYCLE + INSTRUCTION_OVERHEAD_CYCLES


@dataclass(frozen=True)
class Estimate:
    """Estimated busy time of each engine of one trn1 NeuronCore, in seconds."""

    tensor_seconds: float
    vector_seconds: float
    scalar_seconds: float
    gpsimd_seconds: float
    dma_seconds: float
    overlapped_seconds: float  # max over engines: engines run side by side
    serial_seconds: float  # sum over engines: no overlap at all
    label: str = ESTIMATE_LABEL

    def as_dict(self) -> dict[str, float | str]:
        """JSON-serialisable form."""
        return asdict(self)


def estimate(engine_cycles: dict[str, float], dma_bytes: int) -> Estimate:
    """Turn per-engine cycles and DMA bytes into an :class:`Estimate`."""
    seconds = {name: engine_cycles.get(name, 0.0) / CLOCK_HZ for name in COMPUTE_ENGINES}
    seconds["dma"] = dma_bytes / HBM_BYTES_PER_SECOND_PER_CORE
    return Estimate(
        tensor_seconds=seconds["tensor"],
        vector_seconds=seconds["vector"],
        scalar_seconds=seconds["scalar"],
        gpsimd_seconds=seconds["gpsimd"],
        dma_seconds=seconds["dma"],
        overlapped_seconds=max(seconds.values()),
        serial_seconds=sum(seconds.values()),
    )
