"""The gradient's large tensors split over the ranks of a distributed run.

Each rank holds only its share of a tensor, in its own store: :class:`ColumnSplit` gives every
rank some column ranges (the amplitude sweep makes Gamma by occupied column blocks, the JK
pass fits its integrals by occupied column blocks), :class:`RowSplit` some row ranges (the
integral sweeps go by auxiliary blocks). A pass that needs the other orientation (the RI
pass reads G by auxiliary rows) reads every rank's store after :meth:`publish`: with several
ranks the stores are scratch files the other ranks open read-only, so a rank never holds more
than its share plus the rows or columns it is working on. With one rank the split is the
plain store (in memory or a scratch file).
"""
from __future__ import annotations

from collections.abc import Callable

import torch

from dfmp2.df.store import ScratchB
from dfmp2.system.distributed import World, deal_pairs

Range = tuple[int, int]
# (name, rows, columns) -> a store of that shape (InMemoryB or ScratchB).
OpenTensor = Callable[[str, int, int], object]


def deal_ranges(ranges: list[Range], world: World) -> list[list[Range]]:
    """``ranges`` dealt out over the ranks by length (longest first, to the least loaded
    rank), each rank's in ascending order."""
    dealt = deal_pairs(ranges, lambda item: item[1] - item[0], world.size)
    return [sorted(batch) for batch in dealt]


def spans(owned: list[Range]) -> list[Range]:
    """Ascending ``owned`` ranges with the adjacent ones merged."""
    merged: list[Range] = []
    for lo, hi in sorted(owned):
        if merged and merged[-1][1] == lo:
            merged[-1] = (merged[-1][0], hi)
        else:
            merged.append((lo, hi))
    return merged


def _locals(owned: list[Range]) -> tuple[dict[Range, int], int]:
    """The offset of each span of the owned ranges in the rank's store (where they lie side
    by side in ascending order), and the store's length."""
    offsets, length = {}, 0
    for lo, hi in spans(owned):
        offsets[(lo, hi)] = length
        length += hi - lo
    return offsets, length


class _Split:
    """What both orientations share: ranges per rank, this rank's store, the other ranks'
    stores once published."""

    def __init__(self, name: str, ranges: list[list[Range]], world: World,
                 open_tensor: OpenTensor, shape: Callable[[int], tuple[int, int]],
                 adopt=None) -> None:
        self.ranges, self.world = ranges, world
        self.layouts = [_locals(owned)[0] for owned in ranges]
        self.offsets, length = _locals(ranges[world.rank])
        self.store = adopt if adopt is not None else open_tensor(name, *shape(length))
        self.stores: list | None = [self.store] if world.size == 1 else None

    def owned(self) -> list[Range]:
        """This rank's ranges, ascending."""
        return sorted(self.ranges[self.world.rank])

    def spans(self) -> list[Range]:
        """This rank's ranges with the adjacent ones merged (one rank: the whole axis)."""
        return list(self.offsets)

    def _local(self, lo: int, hi: int) -> tuple[int, int]:
        for (r0, r1), offset in self.offsets.items():
            if r0 <= lo and hi <= r1:
                return offset + lo - r0, offset + hi - r0
        raise ValueError(f"[{lo}, {hi}) is not held by rank {self.world.rank}")

    def publish(self, what: str) -> None:
        """Open every other rank's finished store (collective). A store's owner may delete
        it afterwards: a file that is open stays readable."""
        if self.world.size == 1:
            return
        shared = self.world.gather(self.store.share(), f"sharing {what}")
        self.stores = [self.store if rank == self.world.rank else ScratchB.open_shared(file)
                       for rank, file in enumerate(shared)]
        self.world.barrier(f"opening {what}")

    def close(self) -> None:
        for store in self.stores or [self.store]:
            store.close()


class ColumnSplit(_Split):
    """An (nrows, ncols) tensor whose column ranges ``ranges[rank]`` are held by each rank;
    ``adopt`` is a store of this rank's shape to hold them instead of a new one."""

    def __init__(self, name: str, nrows: int, ncols: int, ranges: list[list[Range]],
                 world: World, open_tensor: OpenTensor, adopt=None) -> None:
        super().__init__(name, ranges, world, open_tensor, lambda length: (nrows, length),
                         adopt)
        self.shape = (nrows, ncols)

    def write_columns(self, c0: int, c1: int, values: torch.Tensor) -> None:
        self.store.write_columns(*self._local(c0, c1), values)

    def read_columns(self, c0: int, c1: int) -> torch.Tensor:
        return self.store.read_columns(*self._local(c0, c1))

    def read_rows(self, p0: int, p1: int) -> torch.Tensor:
        """Rows [p0, p1) of every column, from every rank's store (after :meth:`publish`)."""
        if self.world.size == 1:
            return self.store.read_rows(p0, p1)
        out = torch.empty((p1 - p0, self.shape[1]), dtype=torch.float64)
        for layout, store in zip(self.layouts, self.stores):
            if not layout:
                continue
            rows = store.read_rows(p0, p1)
            for (lo, hi), offset in layout.items():
                out[:, lo:hi] = rows[:, offset:offset + hi - lo]
        return out


class RowSplit(_Split):
    """An (nrows, ncols) tensor whose row ranges ``ranges[rank]`` are held by each rank."""

    def __init__(self, name: str, nrows: int, ncols: int, ranges: list[list[Range]],
                 world: World, open_tensor: OpenTensor) -> None:
        super().__init__(name, ranges, world, open_tensor, lambda length: (length, ncols))
        self.shape = (nrows, ncols)

    def write_rows(self, p0: int, p1: int, rows: torch.Tensor) -> None:
        self.store.write_rows(*self._local(p0, p1), rows)

    def read_columns(self, c0: int, c1: int) -> torch.Tensor:
        """Columns [c0, c1) of every row, from every rank's store (after :meth:`publish`)."""
        if self.world.size == 1:
            return self.store.read_columns(c0, c1)
        out = torch.empty((self.shape[0], c1 - c0), dtype=torch.float64)
        for layout, store in zip(self.layouts, self.stores):
            if not layout:
                continue
            columns = store.read_columns(c0, c1)
            for (lo, hi), offset in layout.items():
                out[lo:hi] = columns[offset:offset + hi - lo]
        return out
