"""The single exception type the interpreter raises for NKI rule violations."""

from __future__ import annotations


class NKIRuleError(Exception):
    """A kernel broke a rule of the NKI 0.3.0 subset (see the rule table in docs/kernels.md).

    The message always starts with the rule id in brackets, e.g. ``[partition-limit]``,
    followed by a description naming the offending shape(s).
    """

    def __init__(self, rule: str, message: str) -> None:
        self.rule = rule
        super().__init__(f"[{rule}] {message}")


def shape_str(shape: tuple[int, ...]) -> str:
    """Format a shape the way every rule message names it: ``(128, 512)``."""
    return "(" + ", ".join(str(int(d)) for d in shape) + ("," if len(shape) == 1 else "") + ")"


NOT_IN_SUBSET = "not-in-subset"


def not_in_subset(what: str) -> NKIRuleError:
    """The error for an NKI API or Python form the interpreter does not model (it may exist in
    NKI 0.3.0): refusing it names the gap instead of failing with an AttributeError/TypeError."""
    return NKIRuleError(
        NOT_IN_SUBSET,
        f"{what} is not in the interpreter's NKI 0.3.0 subset (docs/kernels.md lists what is "
        "modelled); kernels tested here may use only that subset",
    )
