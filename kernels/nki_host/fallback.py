"""The fallback policy of the NKI kernel set, in one place.

A kernel call runs on NKI; if that fails it either raises :class:`NkiRequired` (when NKI is
required) or warns, counts a fallback in the accounting and runs the torch fp32 kernel (which
records itself under its torch executor). A call is recorded under the NKI executor only when
it really ran there: when it launched a kernel.

A request to stop the run that lands while a kernel runs (the application's signal handler
raising its exception there) is no kernel failure: an exception whose class sets a true
``stops_run`` attribute passes through, without a warning, a fallback or a torch rerun.
"""
from __future__ import annotations

import warnings
from typing import Callable, TypeVar

from kernels.accounting import KernelAccounting, NkiRequired

Result = TypeVar("Result")


class FallbackPolicy:
    """Runs NKI calls for one kernel set: ``executor`` names where they run (e.g.
    ``nki-interpreter``); ``require_nki`` forbids the torch fallback."""

    def __init__(self, accounting: KernelAccounting, executor: str, require_nki: bool,
                 launched: Callable[[], int]) -> None:
        self.accounting = accounting
        self.executor = executor
        self.require_nki = require_nki
        self.launched = launched
        """How many kernels the launcher has run so far."""

    def run(self, kernel: str, nki_call: Callable[[], Result],
            torch_call: Callable[[], Result]) -> Result:
        """``nki_call()``, recorded as ``kernel`` on the NKI executor; on failure NkiRequired,
        or a warning, a counted fallback and ``torch_call()``."""
        before = self.launched()
        try:
            result = nki_call()
        except Exception as exc:
            if getattr(exc, "stops_run", False):
                raise
            reason = f"{type(exc).__name__}: {exc}"
            if self.require_nki:
                raise NkiRequired(
                    f"NKI kernel {kernel} failed on {self.executor} and NKI is required "
                    f"(require_nki), so there is no torch fallback: {reason}") from exc
            warnings.warn(f"NKI kernel {kernel} failed on {self.executor}; falling back to torch "
                          f"fp32: {reason}", RuntimeWarning, stacklevel=3)
            self.accounting.record_fallback(kernel, reason)
            return torch_call()
        # An empty operand (the beta channel of the H atom) is answered on the host without
        # a launch: nothing ran on NKI to record.
        if self.launched() > before:
            self.accounting.record(kernel, self.executor)
        return result
