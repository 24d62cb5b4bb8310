"""Instruction, byte and flop counts of interpreted kernel launches."""

from __future__ import annotations

from typing import Any

from .cost_model import ENGINES, Estimate, elementwise_cycles, estimate, matmul_cycles


class Profile:
    """Counters accumulated over every ``simulate`` call the profile is passed to.

    ``instructions`` / ``elements`` / ``engine_cycles`` are keyed by engine name: ``tensor``
    (nc_matmul, nc_transpose), ``vector``, ``scalar`` (activation), ``gpsimd`` (memset) and
    ``dma`` (load, store, dma_copy, load_transpose2d).
    """

    def __init__(self) -> None:
        self.launches = 0
        self.instructions: dict[str, int] = dict.fromkeys(ENGINES, 0)
        self.elements: dict[str, int] = dict.fromkeys(ENGINES, 0)
        self.engine_cycles: dict[str, float] = dict.fromkeys(ENGINES, 0.0)
        self.dma_bytes = 0
        self.matmul_flops = 0
        self.transposes = 0
        self.peak_sbuf_bytes_per_partition = 0
        self.peak_psum_banks = 0
        self.notes: list[str] = []

    def record_elementwise(self, engine: str, partitions: int, per_partition: int) -> None:
        """Count one Vector / Scalar / GpSimd instruction."""
        self.instructions[engine] += 1
        self.elements[engine] += partitions * per_partition
        self.engine_cycles[engine] += elementwise_cycles(per_partition)

    def record_matmul(self, k: int, m: int, n: int, low_precision: bool) -> None:
        """Count one nc_matmul of stationary[K, M] and moving[K, N]."""
        self.instructions["tensor"] += 1
        self.elements["tensor"] += m * n
        self.matmul_flops += 2 * k * m * n
        self.engine_cycles["tensor"] += matmul_cycles(n, low_precision)

    def record_transpose(self, partitions: int, free: int, low_precision: bool) -> None:
        """Count one Tensor Engine transpose (a matmul against an identity of size partitions)."""
        self.instructions["tensor"] += 1
        self.elements["tensor"] += partitions * free
        self.transposes += 1
        self.engine_cycles["tensor"] += matmul_cycles(partitions, low_precision)

    def record_dma(self, elements: int, nbytes: int) -> None:
        """Count one DMA transfer."""
        self.instructions["dma"] += 1
        self.elements["dma"] += elements
        self.dma_bytes += nbytes

    def note(self, text: str) -> None:
        """Remember a remark about a run (e.g. a kernel writing into one of its inputs)."""
        if text not in self.notes:
            self.notes.append(text)

    def add(self, other: Profile) -> None:
        """Accumulate another profile's counts into this one."""
        self.launches += other.launches
        for engine in ENGINES:
            self.instructions[engine] += other.instructions[engine]
            self.elements[engine] += other.elements[engine]
            self.engine_cycles[engine] += other.engine_cycles[engine]
        self.dma_bytes += other.dma_bytes
        self.matmul_flops += other.matmul_flops
        self.transposes += other.transposes
        self.peak_sbuf_bytes_per_partition = max(
            self.peak_sbuf_bytes_per_partition, other.peak_sbuf_bytes_per_partition)
        self.peak_psum_banks = max(self.peak_psum_banks, other.peak_psum_banks)
        for text in other.notes:
            self.note(text)

    def estimate_trn1(self) -> Estimate:
        """Estimated trn1 NeuronCore time of everything counted (a model, not a measurement)."""
        return estimate(self.engine_cycles, self.dma_bytes)

    def as_dict(self) -> dict[str, Any]:
        """JSON-serialisable snapshot, including the estimate."""
        return {
            "launches": self.launches,
            "instructions": dict(self.instructions),
            "elements": dict(self.elements),
            "engine_cycles": dict(self.engine_cycles),
            "dma_bytes": self.dma_bytes,
            "matmul_flops": self.matmul_flops,
            "transposes": self.transposes,
            "peak_sbuf_bytes_per_partition": self.peak_sbuf_bytes_per_partition,
            "peak_psum_banks": self.peak_psum_banks,
            "notes": list(self.notes),
            "estimate_trn1": self.estimate_trn1().as_dict(),
        }
