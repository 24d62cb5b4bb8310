"""Per-launch interpreter state: the profile being filled and on-chip capacity tracking.

The capacities are trn1's, from :mod:`kernels.trn1` (the one source the kernels and the host
use too)."""

from __future__ import annotations

import sys
import types
import weakref
from contextlib import contextmanager
from typing import Iterator

from kernels.trn1 import PSUM_BANK_BYTES, PSUM_BANKS, SBUF_BYTES_PER_PARTITION

from .errors import NKIRuleError, shape_str
from .profile import Profile


class MemoryTracker:
    """Live on-chip bytes per partition (SBUF) and live PSUM banks of one launch.

    A tile is live while any view of it is referenced; ``weakref.finalize`` releases it. The
    capacity check of a new tile is deferred to the next allocation (HBM ones included) or
    instruction, so that ``t = nl.ndarray(...)`` inside an unrolled loop is not charged while
    the previous ``t`` is still bound during the assignment, and to the kernel's return
    (:meth:`close`). At the return the kernel's locals would die with its frame before anything
    could look at them, so the tracker holds the kernel's frame (found at its first allocation)
    until :meth:`close` has checked the tiles they keep live.
    """

    def __init__(self, profile: Profile) -> None:
        self.profile = profile
        self.sbuf_bytes = 0
        self.psum_banks = 0
        self.pending: tuple[int, ...] | None = None
        self.placed: list[tuple[weakref.ref, object, tuple[int, int], list]] = []
        self.kernel_code: types.CodeType | None = None
        self._kernel_frame: types.FrameType | None = None

    def _hold_kernel_frame(self) -> None:
        """Keep a reference to the running kernel's frame (see the class notes)."""
        if self._kernel_frame is not None or self.kernel_code is None:
            return
        frame = sys._getframe(1)
        while frame is not None and frame.f_code is not self.kernel_code:
            frame = frame.f_back
        self._kernel_frame = frame

    def close(self, returned: bool) -> None:
        """At the kernel's end: when it ``returned`` (rather than raised), run the deferred
        capacity check while the kernel's locals are still held; then let them go."""
        frame, self._kernel_frame = self._kernel_frame, None
        try:
            if returned:
                self.verify()
        finally:
            if frame is not None:
                frame.clear()

    def place(self, owner: object, buffer: object, partitions: tuple[int, int],
              spans: list[tuple[int, int]]) -> None:
        """Record a tile placed with ``address=`` (its partitions, and its byte span under
        each reading of the free offset); one that overlaps a live placed tile of the same
        buffer under both readings is refused: the two would share memory, which the
        interpreter, keeping every tile apart, would hide (x + y gave 6 where the device's y
        had overwritten x, 10)."""
        self.placed = [entry for entry in self.placed if entry[0]() is not None]
        for other, other_buffer, other_partitions, other_spans in self.placed:
            if (other_buffer is buffer and partitions[0] < other_partitions[1]
                    and other_partitions[0] < partitions[1]
                    and all(lo < other_hi and other_lo < hi for (lo, hi), (other_lo, other_hi)
                            in zip(spans, other_spans))):
                raise NKIRuleError(
                    "address-overlap",
                    f"a tile placed in {buffer!r} at partitions {partitions[0]}:{partitions[1]} "
                    f"overlaps the live tile placed at {other_partitions[0]}:"
                    f"{other_partitions[1]} of the same bytes")
        self.placed.append((weakref.ref(owner), buffer, partitions, spans))

    def acquire_sbuf(self, owner: object, shape: tuple[int, ...], nbytes: int) -> None:
        """Account ``nbytes`` per partition of SBUF for ``owner`` until it is collected."""
        if nbytes > SBUF_BYTES_PER_PARTITION:
            raise NKIRuleError(
                "sbuf-capacity",
                f"SBUF tile {shape_str(shape)} needs {nbytes} B per partition; trn1 has "
                f"{SBUF_BYTES_PER_PARTITION} B per partition",
            )
        self.verify()
        self._hold_kernel_frame()
        self.sbuf_bytes += nbytes
        self.pending = shape
        weakref.finalize(owner, self._release_sbuf, nbytes)

    def acquire_psum(self, owner: object, shape: tuple[int, ...], nbytes: int) -> None:
        """Account one PSUM bank for ``owner`` until it is collected."""
        if nbytes > PSUM_BANK_BYTES:
            raise NKIRuleError(
                "psum-bank",
                f"PSUM tile {shape_str(shape)} needs {nbytes} B per partition; one PSUM bank "
                f"holds {PSUM_BANK_BYTES} B per partition (512 fp32)",
            )
        self.verify()
        self._hold_kernel_frame()
        self.psum_banks += 1
        self.pending = shape
        weakref.finalize(owner, self._release_psum)

    def verify(self) -> None:
        """Check the live totals against trn1 capacity, naming the latest allocated tile."""
        shape, self.pending = self.pending, None
        if shape is None:
            return
        profile = self.profile
        profile.peak_sbuf_bytes_per_partition = max(profile.peak_sbuf_bytes_per_partition,
                                                    self.sbuf_bytes)
        profile.peak_psum_banks = max(profile.peak_psum_banks, self.psum_banks)
        if self.sbuf_bytes > SBUF_BYTES_PER_PARTITION:
            raise NKIRuleError(
                "sbuf-capacity",
                f"after allocating tile {shape_str(shape)}, {self.sbuf_bytes} B per partition of "
                f"SBUF are live; trn1 has {SBUF_BYTES_PER_PARTITION} B per partition",
            )
        if self.psum_banks > PSUM_BANKS:
            raise NKIRuleError(
                "psum-banks-live",
                f"after allocating PSUM tile {shape_str(shape)}, {self.psum_banks} PSUM banks are "
                f"live; trn1 has {PSUM_BANKS}",
            )

    def _release_sbuf(self, nbytes: int) -> None:
        self.sbuf_bytes -= nbytes

    def _release_psum(self) -> None:
        self.psum_banks -= 1


class RunState:
    """Everything one kernel launch accumulates."""

    __slots__ = ("profile", "memory")

    def __init__(self) -> None:
        self.profile = Profile()
        self.profile.launches = 1
        self.memory = MemoryTracker(self.profile)


_STACK: list[RunState] = []


def current() -> RunState:
    """The state of the launch being interpreted; instructions outside a kernel are errors."""
    if not _STACK:
        raise NKIRuleError(
            "outside-kernel",
            "NKI instructions and tensor allocations run only inside a kernel launched through "
            "simulate() or a called @nki.jit kernel",
        )
    return _STACK[-1]


@contextmanager
def launch() -> Iterator[RunState]:
    """Open a kernel launch: instructions executed inside count towards its state."""
    state = RunState()
    _STACK.append(state)
    try:
        yield state
    finally:
        _STACK.pop()
