"""Who ran each kernel call: the honesty ledger behind the run record's /backend group."""
from __future__ import annotations

import logging
from collections import Counter
from dataclasses import dataclass, field

log = logging.getLogger(__name__)


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

    def record(self, kernel: str, executor: str, count: int = 1) -> None:
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
