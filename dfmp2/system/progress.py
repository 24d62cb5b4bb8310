"""A minimal progress bar on stderr for long loops, shown only on a terminal."""
from __future__ import annotations

import sys
import time

BAR_WIDTH = 30
MIN_INTERVAL_SECONDS = 0.2


class Progress:
    def __init__(self, total: int, label: str, enabled: bool | None = None) -> None:
        self.total = max(1, total)
        self.label = label
        self.done = 0
        self.enabled = sys.stderr.isatty() if enabled is None else enabled
        self._last = 0.0

    def advance(self, steps: int = 1) -> None:
        self.done += steps
        now = time.monotonic()
        if self.enabled and (now - self._last >= MIN_INTERVAL_SECONDS or self.done >= self.total):
            self._last = now
            filled = BAR_WIDTH * self.done // self.total
            sys.stderr.write(f"\r{self.label} [{'#' * filled}{'.' * (BAR_WIDTH - filled)}] "
                             f"{self.done}/{self.total}")
            if self.done >= self.total:
                sys.stderr.write("\n")
            sys.stderr.flush()
