"""Several workers on one calculation with torch.distributed (torchrun or Slurm's srun).

Rank 0 runs the SCF and broadcasts the orbitals; rank 0 builds B once into the HDF5 scratch
file of the out-of-core path and the other ranks read their blocks from it (a shared folder
is needed across nodes). Block pairs are dealt out by cost, longest first, to the least loaded
rank; after every round the ranks gather what they finished, so rank 0 can checkpoint each
pair in the record (a resumed run skips them, whatever the world size) and the fp64 sums are
combined in a fixed order. Collectives time out, so a lost rank ends the job with an error
instead of a hang.
"""
from __future__ import annotations

import datetime as dt
import logging
import os
from dataclasses import dataclass, field

import torch
import torch.distributed as torch_dist

from dfmp2.errors import RunFailure

log = logging.getLogger(__name__)
# How long a collective may wait for a rank before the job is declared broken.
COLLECTIVE_TIMEOUT = dt.timedelta(seconds=int(os.environ.get("DFMP2_DIST_TIMEOUT", "300")))
DEFAULT_MASTER_PORT = "29500"
# A diagonal (syrk) block pair costs about half an off-diagonal one.
DIAGONAL_COST = 0.5


def slurm_to_torch_env() -> None:
    """Map an `srun` task's Slurm variables onto torch.distributed's when torchrun is absent."""
    if "RANK" in os.environ or "SLURM_PROCID" not in os.environ:
        return
    if int(os.environ.get("SLURM_NTASKS", "1")) < 2:
        return
    os.environ["RANK"] = os.environ["SLURM_PROCID"]
    os.environ["WORLD_SIZE"] = os.environ["SLURM_NTASKS"]
    os.environ.setdefault("LOCAL_RANK", os.environ.get("SLURM_LOCALID", "0"))
    os.environ.setdefault("MASTER_ADDR", os.environ.get("SLURM_LAUNCH_NODE_IPADDR", "127.0.0.1"))
    os.environ.setdefault("MASTER_PORT", DEFAULT_MASTER_PORT)


def launched_world_size() -> int:
    slurm_to_torch_env()
    return int(os.environ.get("WORLD_SIZE", "1"))


def rank() -> int:
    return int(os.environ.get("RANK", "0"))


@dataclass
class World:
    """The process group of a distributed run (or a world of one)."""

    size: int = 1
    rank: int = 0
    backend: str = "none"
    timings: dict[str, float] = field(default_factory=dict)

    @property
    def is_root(self) -> bool:
        return self.rank == 0

    def barrier(self, what: str) -> None:
        if self.size > 1:
            _guard(lambda: torch_dist.barrier(), what)

    def broadcast(self, value, what: str):
        """``value`` from rank 0 on every rank."""
        if self.size == 1:
            return value
        box = [value]
        _guard(lambda: torch_dist.broadcast_object_list(box, src=0), what)
        return box[0]

    def gather(self, value, what: str) -> list:
        """Every rank's ``value``, in rank order, on every rank."""
        if self.size == 1:
            return [value]
        out = [None] * self.size
        _guard(lambda: torch_dist.all_gather_object(out, value), what)
        return out

    def close(self) -> None:
        if self.size > 1 and torch_dist.is_initialized():
            torch_dist.destroy_process_group()


def _guard(call, what: str) -> None:
    try:
        call()
    except RuntimeError as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise RunFailure(f"distributed run broken while {what}: another rank failed or is "
                         f"unreachable ({first[:160]})") from None


def init_world() -> World:
    """Join the process group when launched by torchrun or srun with more than one task."""
    size = launched_world_size()
    if size < 2:
        return World()
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    try:
        torch_dist.init_process_group(backend=backend, timeout=COLLECTIVE_TIMEOUT)
    except (RuntimeError, ValueError) as exc:
        raise RunFailure(f"cannot join the distributed job ({exc}); launch with torchrun or "
                         "srun, with MASTER_ADDR/MASTER_PORT reachable") from None
    world = World(size, torch_dist.get_rank(), backend)
    log.info("rank %d of %d (%s)", world.rank, world.size, backend)
    return world


def deal_pairs(work: list, cost, nranks: int) -> list[list]:
    """Longest-processing-time-first assignment: each item to the least loaded rank."""
    loads = [0.0] * nranks
    assignment: list[list] = [[] for _ in range(nranks)]
    for item in sorted(work, key=cost, reverse=True):
        target = min(range(nranks), key=lambda r: (loads[r], r))
        assignment[target].append(item)
        loads[target] += cost(item)
    return assignment
