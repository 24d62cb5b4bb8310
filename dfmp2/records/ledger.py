"""``/backend`` (and ``/scf_engine``'s kernel calls): which kernels ran where, how often, and
what fell back, so that a record says honestly what computed it."""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from dfmp2.records.sections import Section, from_attr, text_list
from dfmp2.errors import InputError
from dfmp2.records.tree import FOREIGN_RECORD, Node
from dfmp2.system.interrupts import written_whole
from kernels.interface import KernelSet


@dataclass(frozen=True)
class BackendFacts(Section):
    """``/backend``: which kernels ran where (the call counts are added by
    :func:`write_kernel_ledger`)."""

    group_name: ClassVar[str] = "backend"
    backend: str
    precision: str
    device: str
    fused_energy: bool


@written_whole
def write_kernel_ledger(node: Node, calls: dict[tuple[str, str], int], fallbacks: int,
                        fallback_reasons: list[str], report: dict[str, Any],
                        group_name: str = BackendFacts.group_name) -> None:
    """Call counts as ``calls.<kernel>.<executor>``, fallbacks, and the backend's own facts
    (on NKI: mode, signatures, launches and the estimated trn1 time), in ``/backend`` (the
    MP2 stage's kernels) or another group (``/scf_engine``: the SCF's)."""
    group = node.group(group_name)
    group.attrs.update({f"calls.{kernel}.{executor}": int(n)
                        for (kernel, executor), n in sorted(calls.items())})
    group.attrs["executors"] = sorted({executor for _, executor in calls})
    group.attrs["fallbacks"] = fallbacks
    group.attrs["fallback_reasons"] = fallback_reasons
    group.attrs.update(report)


@written_whole
def write_accounting(node: Node, accounting, report: dict[str, Any],
                     group_name: str = BackendFacts.group_name) -> None:
    """A :class:`kernels.accounting.KernelAccounting`'s calls and fallbacks, with the kernel
    set's ``report``, as :func:`write_kernel_ledger` writes them."""
    write_kernel_ledger(node, dict(accounting.calls), accounting.fallbacks,
                        list(accounting.fallback_reasons), report, group_name)


@dataclass(frozen=True)
class KernelLedger:
    """What :func:`read_kernel_ledger` gives back."""

    backend: str | None
    precision: str | None
    device: str | None
    fused_energy: bool | None
    fallbacks: int | None
    calls: dict[str, int]
    nki_mode: str | None
    signatures: int | None
    estimate: dict | None


def executors_of(node: Node) -> list[str]:
    """Where the record's kernels ran (``torch-cpu``, ``nki-interpreter``, ...), MP2 stage
    and SCF together: what a figure measured on them measured."""
    found = set()
    for name in (BackendFacts.group_name, "scf_engine"):
        group = node.groups.get(name)
        if group is not None:
            stored = group.attrs.get("executors", [])
            found.update(text_list(stored, f"/{name} executors", "a list of executors")
                         if isinstance(stored, str) else (str(e) for e in np.atleast_1d(stored)))
    return sorted(found)


def fallbacks_of(node: Node) -> int:
    """Kernel calls that fell back from NKI to torch, in the MP2 stage and the SCF together
    (``--json`` counted the MP2 stage's alone, so an SCF whose builds all fell back said 0)."""
    return sum(int(group.attrs.get("fallbacks", 0))
               for name in (BackendFacts.group_name, "scf_engine")
               if (group := node.groups.get(name)) is not None)


def read_kernel_ledger(node: Node) -> KernelLedger | None:
    group = node.groups.get(BackendFacts.group_name)
    if group is None:
        return None
    attrs = group.attrs
    estimate = attrs.get("estimate")
    if isinstance(estimate, str):
        estimate = json.loads(estimate) if estimate not in ("none", "") else None
    return KernelLedger(attrs.get("backend"), attrs.get("precision"), attrs.get("device"),
                        attrs.get("fused_energy"), attrs.get("fallbacks"),
                        {k[len("calls."):]: int(v) for k, v in attrs.items()
                         if k.startswith("calls.")},
                        attrs.get("nki_mode"), attrs.get("signatures"), estimate or None)


def stored_calls(node: Node, group_name: str = BackendFacts.group_name
                 ) -> tuple[dict[tuple[str, str], int], int, list[str]] | None:
    """An interrupted run's ``/backend`` (or ``group_name``) calls, fallbacks and reasons as
    a :meth:`kernels.accounting.KernelAccounting.snapshot` (None: it has none, as when it was
    killed before its end could write them)."""
    group = node.groups.get(group_name)
    if group is None:
        return None
    calls = {}
    for key, value in group.attrs.items():
        if key.startswith("calls.") and key.count(".") >= 2:
            _, kernel, executor = key.split(".", 2)
            calls[(kernel, executor)] = _count(value, group_name, key)
    # Read as an array, the JSON text was one reason: '[]' in every resumed record.
    reasons = text_list(group.attrs.get("fallback_reasons", "[]"),
                        f"/{group_name} fallback_reasons",
                        "the list of fallback reasons dfmp2 writes")
    return calls, _count(group.attrs.get("fallbacks", 0), group_name, "fallbacks"), reasons


def _count(value: Any, group_name: str, key: str) -> int:
    """A stored number of calls: a count, or an input error naming the attribute."""
    count = from_attr(value, "int", f"/{group_name} {key}")
    if count < 0:
        raise InputError(f"the record's /{group_name} {key} holds {count}, not a count; "
                         f"{FOREIGN_RECORD}")
    return count


def hand_over_ledger(kernel_set: KernelSet) -> tuple:
    """A rank's kernel calls and NKI launches since its last hand-over, for rank 0's record;
    it then counts afresh."""
    return kernel_set.accounting.hand_over(), kernel_set.hand_over_launches()


def absorb_ledger(kernel_set: KernelSet, share: tuple) -> None:
    """Another rank's :func:`hand_over_ledger` into this rank's ledger: the record's calls,
    launches, signatures and estimate then count every rank's kernels alike (the launches
    and estimate were rank 0's alone beside every rank's calls)."""
    calls, launches = share
    kernel_set.accounting.absorb(calls)
    kernel_set.absorb_launches(launches)
