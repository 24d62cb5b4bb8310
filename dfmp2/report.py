"""Readable text for a run record: the summary `run` prints and `show` prints."""
from __future__ import annotations

import json

import numpy as np

from dfmp2.record import Node

ENERGY_ROWS = (("E(SCF)", "scf", "e_tot"), ("E_OS", "mp2", "e_os"), ("E_SS", "mp2", "e_ss"),
               ("E_corr", "mp2", "e_corr"), ("E_SCS", "mp2", "e_scs"),
               ("E_SOS", "mp2", "e_sos"), ("E_tot", "mp2", "e_tot"),
               ("E_tot(SCS)", "mp2", "e_tot_scs"), ("E_tot(SOS)", "mp2", "e_tot_sos"))
TIMING_ORDER = ("scf", "metric", "integrals", "transform", "fit", "energy", "mp2", "reference",
                "total")


def _get(root: Node, group: str, key: str):
    node = root.groups.get(group)
    return None if node is None else node.attrs.get(key)


def summary(root: Node) -> str:
    inputs = root.groups.get("input", Node()).attrs
    lines = [f"dfmp2 run record: status {root.attrs.get('status')}"]
    if inputs:
        lines.append(f"  molecule {inputs.get('source')}  basis {inputs.get('basis')}  "
                     f"auxbasis {inputs.get('auxbasis')}  charge {inputs.get('charge')}  "
                     f"spin {inputs.get('spin')}  frozen {inputs.get('frozen')}")
    sizes = root.groups.get("sizes")
    if sizes:
        lines.append("  sizes    " + "  ".join(f"{k} {sizes.attrs[k]}" for k in
                                               ("nao", "naux", "nocc", "nvir", "nfrozen")))
    backend = root.groups.get("backend")
    if backend:
        b = backend.attrs
        calls = ", ".join(f"{k[len('calls.'):]}={v}" for k, v in b.items()
                          if k.startswith("calls."))
        lines.append(f"  backend  {b.get('backend')} {b.get('precision')} on {b.get('device')}"
                     f"  fused_energy {b.get('fused_energy')}  fallbacks {b.get('fallbacks')}")
        if calls:
            lines.append(f"  calls    {calls}")
        if "signatures" in b:
            lines.append(f"  NKI      mode {b.get('nki_mode')}  distinct signatures "
                         f"{b.get('signatures')}")
        if "estimate" in b:
            estimate = (json.loads(b["estimate"]) if isinstance(b["estimate"], str)
                        else dict(b["estimate"]))
            if estimate:
                lines.append(f"  {estimate.get('label', 'estimate')}: "
                             f"{estimate.get('overlapped_seconds', float('nan')):.3e} s")
    if "error" in root.attrs:
        lines.append(f"  error    {root.attrs['error']}")
    lines.append("")
    for label, group, key in ENERGY_ROWS:
        value = _get(root, group, key)
        if value is not None:
            lines.append(f"  {label:<10} {value:20.10f} Eh")
    reference = root.groups.get("reference")
    if reference:
        r = reference.attrs
        verdict = "PASS" if r["passed"] else "FAIL"
        lines.append(f"  PySCF DFMP2 E_corr {r['e_corr']:.10f} Eh   dE = {r['delta_e_corr']:.2e} "
                     f"Eh (tolerance {r['tolerance']:.0e}): {verdict}")
    timings = root.groups.get("timings")
    if timings:
        lines.append("")
        parts = [f"{k} {timings.attrs[k]:.2f}s" for k in TIMING_ORDER if k in timings.attrs]
        lines.append("  timings  " + "  ".join(parts))
    return "\n".join(lines)


def _format_value(value) -> str:
    if isinstance(value, float):
        return f"{value:.12g}"
    text = str(value)
    return text if len(text) <= 100 else text[:97] + "..."


def dump(root: Node, indent: str = "") -> str:
    """Every group, attribute and dataset of a record (datasets by shape, small ones inline)."""
    lines = []
    for key, value in sorted(root.attrs.items()):
        if key == "xyz":
            value = value.strip().replace("\n", " | ")
        lines.append(f"{indent}{key} = {_format_value(value)}")
    for key, array in sorted(root.datasets.items()):
        array = np.asarray(array)
        shown = np.array2string(array, precision=6, threshold=8) if array.size <= 8 else ""
        lines.append(f"{indent}{key}: dataset {array.dtype} {array.shape} {shown}".rstrip())
    for key, child in sorted(root.groups.items()):
        lines.append(f"{indent}/{key}")
        lines.append(dump(child, indent + "  "))
    return "\n".join(line for line in lines if line)
