"""Who ran each kernel call: the honesty ledger behind the run record's /backend group."""
from __future__ import annotations

import logging
import threading
from collections import Counter
from dataclasses import dataclass, field

log = logging.getLogger(__name__)
# Where work ran that a killed run finished but could not account for.
UNRECORDED_EXECUTOR = "unrecorded"


class NkiRequired(RuntimeError):
    """An NKI kernel failed where falling back to torch is forbidden (``require_nki``)."""


@dataclass
class KernelAccounting:
    """Counts kernel calls per (kernel, executor) and fallbacks to torch.

    Executors are strings such as ``torch-cpu``, ``torch-cuda``, ``nki-interpreter``,
    ``nki-simulator`` or ``nki-hardware``. A fallback is a call that was asked of NKI but ran on
    torch; it is counted here and warned about, never hidden.
    """

    calls: Counter = field(default_factory=Counter)
    fallbacks: int = 0
    fallback_reasons: list[str] = field(default_factory=list)
    holds_earlier_ledger: bool = False
    """Whether an interrupted run's ledger was absorbed: it counts what that run built too
    (a B it left in scratch), which must not be counted twice."""
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def record(self, kernel: str, executor: str, count: int = 1) -> None:
        # A J/K build's threads record their products at once, and += on a Counter is a
        # read and a write that another thread may come between.
        with self._lock:
            self.calls[(kernel, executor)] += count

    def record_fallback(self, kernel: str, reason: str) -> None:
        self.fallbacks += 1
        message = f"{kernel}: {reason}"
        if message not in self.fallback_reasons:
            self.fallback_reasons.append(message)
            log.warning("NKI kernel %s fell back to torch: %s", kernel, reason)

    def executors(self) -> list[str]:
        return sorted({executor for _, executor in self.calls})

    def as_attrs(self) -> dict[str, int]:
        """``calls.<kernel>.<executor>`` -> count, as the record's /backend attributes."""
        return {f"calls.{kernel}.{executor}": int(n)
                for (kernel, executor), n in sorted(self.calls.items())}

    def snapshot(self) -> tuple[dict[tuple[str, str], int], int, list[str]]:
        """Calls, fallbacks and their reasons, to send to the rank that writes the record."""
        return dict(self.calls), self.fallbacks, list(self.fallback_reasons)

    def since(self, earlier: tuple[dict[tuple[str, str], int], int, list[str]]
              ) -> tuple[dict[tuple[str, str], int], int, list[str]]:
        """The calls, fallbacks and new reasons since ``earlier`` (a :meth:`snapshot`): what
        one stage ran, for a file that outlives the run to carry."""
        calls, fallbacks, reasons = earlier
        made = {key: n - calls.get(key, 0) for key, n in self.calls.items()
                if n > calls.get(key, 0)}
        return (made, self.fallbacks - fallbacks,
                [r for r in self.fallback_reasons if r not in reasons])

    def hand_over(self) -> tuple[dict[tuple[str, str], int], int, list[str]]:
        """:meth:`snapshot`, then start counting afresh: what a rank sends once rank 0 has
        counted it (the SCF's calls at the SCF's end), so that its later snapshot holds only
        calls made since."""
        handed = self.snapshot()
        self.calls.clear()
        self.fallbacks = 0
        self.fallback_reasons.clear()
        return handed

    def absorb(self, snapshot: tuple[dict[tuple[str, str], int], int, list[str]]) -> None:
        """Add another process's :meth:`snapshot` (another rank's, or an interrupted run's
        whose work this one continues), so the record counts every call behind it."""
        calls, fallbacks, reasons = snapshot
        self.calls.update(calls)
        self.fallbacks += fallbacks
        self.fallback_reasons += [r for r in reasons if r not in self.fallback_reasons]


def encode_calls(snapshot: tuple[dict[tuple[str, str], int], int, list[str]]) -> dict:
    """A :meth:`KernelAccounting.snapshot` as JSON-ready values."""
    calls, fallbacks, reasons = snapshot
    return {"calls": {f"{kernel}.{executor}": n for (kernel, executor), n in calls.items()},
            "fallbacks": fallbacks, "fallback_reasons": list(reasons)}


def decode_calls(encoded: dict) -> tuple[dict[tuple[str, str], int], int, list[str]]:
    """What :func:`encode_calls` wrote, as a snapshot to :meth:`KernelAccounting.absorb`."""
    calls = {tuple(key.split(".", 1)): int(n) for key, n in encoded["calls"].items()}
    return calls, int(encoded["fallbacks"]), [str(r) for r in encoded["fallback_reasons"]]
