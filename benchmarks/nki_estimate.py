"""Estimated trn1 time of the DF-MP2 energy step with the fused NKI kernel (an estimate, not a
measurement): the interpreter's Profile cost model over every launch of the step.

    python benchmarks/nki_estimate.py            # small, medium, large
    python benchmarks/nki_estimate.py --full     # also interpret every launch (slow for large)
    python benchmarks/nki_estimate.py --json out.json
    python benchmarks/nki_estimate.py medium --transform   # also the DF transform, gemm vs split

The energy step is one ``mp2_energy_fused`` call over all pairs i <= j (a diagonal block) with
random fitted blocks of the given shape; the NKI backend splits it into G x G pair tiles.
Every launch with the same signature (kernel, shapes, constants) executes exactly the same
instruction stream, so by default each signature is interpreted once and its Profile counted
once per launch (exact for the cost model; the energies are then not computed). ``--full``
interprets every launch, checks the energies against torch fp64 and the counts against the
per-signature extrapolation.

``--transform`` also estimates the DF transform of the same shape, (P|i nu) = C_occ^T (P|mu nu)
and (P|ia) = (P|i nu) C_vir over naux / 128 auxiliary blocks of 128 functions, once with the
plain fp32 ``gemm`` and once with ``transform_gemm`` (the exact-head split the pipeline uses).
"""
from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from kernels.accounting import KernelAccounting  # noqa: E402
from kernels.nki.launcher import Launcher  # noqa: E402
from kernels.nki_host.kernel_set import NkiKernels  # noqa: E402
from kernels.nki_host.planner import energy_group  # noqa: E402

# auxiliary functions per integral block of the transform estimate (the pipeline's blocks
# follow shell boundaries within a memory budget; 128 is representative)
TRANSFORM_AUX_BLOCK = 128

SHAPES = {  # name: (nbasis, nocc, nvir, naux)
    "small": (128, 16, 112, 384),
    "medium": (512, 64, 448, 1536),
    "large": (768, 96, 672, 2304),
}


class SignatureCachingLauncher(Launcher):
    """Interprets the first launch of each signature; later launches of that signature add the
    recorded per-launch Profile again and return the recorded output (same instruction stream)."""

    def __init__(self) -> None:
        super().__init__("interpreter")
        self._seen: dict[str, tuple[object, object]] = {}

    def launch(self, kernel_name, kernel, *args):
        from kernels.nki import interpreter
        from kernels.nki.launcher import signature_string

        sig = signature_string(kernel_name, args)
        self.launches[sig] += 1
        if sig not in self._seen:
            profile = interpreter.Profile()
            out = interpreter.simulate(kernel, profile=profile)(*args)
            self._seen[sig] = (out, profile)
        out, profile = self._seen[sig]
        self.profile.add(profile)
        return out


def fitted_block(nocc: int, nvir: int, naux: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    b = torch.from_numpy(rng.standard_normal((naux, nocc * nvir)) / math.sqrt(naux))
    e_occ = torch.from_numpy(-1.5 + 1.2 * rng.random(nocc))
    e_vir = torch.from_numpy(0.1 + 3.0 * rng.random(nvir))
    denom = (e_occ[:, None] - e_vir[None, :]).reshape(-1)
    return b, denom


def estimate_shape(name: str, full: bool) -> dict:
    nbasis, nocc, nvir, naux = SHAPES[name]
    b, denom = fitted_block(nocc, nvir, naux)
    launcher = Launcher("interpreter") if full else SignatureCachingLauncher()
    kernels = NkiKernels(accounting=KernelAccounting(), device=torch.device("cpu"),
                         launcher=launcher)
    start = time.perf_counter()
    direct, exchange = kernels.mp2_energy_fused(b, b, denom, denom, nvir, True)
    wall = time.perf_counter() - start
    report = kernels.report()
    x_tiles = math.ceil(naux / 128)
    group = energy_group(nvir, x_tiles, nocc, fused=True)
    row = {
        "shape": name, "nbasis": nbasis, "nocc": nocc, "nvir": nvir, "naux": naux,
        "pairs": nocc * (nocc + 1) // 2, "group": group,
        "launches": sum(report["launches"].values()), "signatures": report["signatures"],
        "estimate": report["estimate"], "instructions": report["instructions"],
        "dma_bytes": report["dma_bytes"], "matmul_flops": report["matmul_flops"],
        "interpreted_every_launch": full, "interpreter_wall_seconds": wall,
    }
    if full:
        t = (b.T @ b).reshape(nocc, nvir, nocc, nvir)
        from kernels.torch_backend import pair_block_sums
        d_ref, x_ref = pair_block_sums(t, denom.reshape(nocc, nvir), denom.reshape(nocc, nvir),
                                       True)
        row["rel_error_direct"] = abs(direct / float(d_ref) - 1)
        row["rel_error_exchange"] = abs(exchange / float(x_ref) - 1)
    return row


def estimate_transform(name: str, method: str) -> dict:
    """The DF transform of shape ``name`` through the kernel-set method ``method`` (``gemm`` or
    ``transform_gemm``), each signature interpreted once."""
    nbasis, nocc, nvir, naux = SHAPES[name]
    rng = np.random.default_rng(0)
    kernels = NkiKernels(accounting=KernelAccounting(), device=torch.device("cpu"),
                         launcher=SignatureCachingLauncher())
    product = getattr(kernels, method)
    occ = torch.from_numpy(rng.standard_normal((nbasis, nocc)))
    vir = torch.from_numpy(rng.standard_normal((nbasis, nvir)))
    lpq = torch.from_numpy(rng.standard_normal((TRANSFORM_AUX_BLOCK, nbasis, nbasis)))
    for _ in range(math.ceil(naux / TRANSFORM_AUX_BLOCK)):
        half = product(occ.T, lpq).reshape(TRANSFORM_AUX_BLOCK * nocc, nbasis)
        product(half, vir)
    report = kernels.report()
    return {"shape": name, "method": method, "launches": sum(report["launches"].values()),
            "signatures": report["signatures"], "matmul_flops": report["matmul_flops"],
            "estimate": report["estimate"], "instructions": report["instructions"],
            "dma_bytes": report["dma_bytes"]}


def transform_markdown(rows: list[dict]) -> str:
    lines = [
        "| shape | kernel-set method | launches | signatures | matmul GFLOP | Tensor ms | "
        "Vector ms | DMA ms | overlapped ms (estimate) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        e = {k: v * 1e3 for k, v in r["estimate"].items() if k.endswith("seconds")}
        lines.append(
            f"| {r['shape']} | `{r['method']}` | {r['launches']} | {r['signatures']} | "
            f"{r['matmul_flops'] / 1e9:.1f} | {e['tensor_seconds']:.2f} | "
            f"{e['vector_seconds']:.2f} | {e['dma_seconds']:.2f} | "
            f"{e['overlapped_seconds']:.2f} |")
    return "\n".join(lines)


def markdown(rows: list[dict]) -> str:
    lines = [
        "| shape (nbasis/nocc/nvir/naux) | pairs | G | launches | signatures | Tensor ms | "
        "Vector ms | DMA ms | overlapped ms (estimate) | serial ms |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        e = {k: v * 1e3 for k, v in r["estimate"].items() if k.endswith("seconds")}
        lines.append(
            f"| {r['shape']} {r['nbasis']}/{r['nocc']}/{r['nvir']}/{r['naux']} | {r['pairs']} | "
            f"{r['group']} | {r['launches']} | {r['signatures']} | {e['tensor_seconds']:.2f} | "
            f"{e['vector_seconds']:.2f} | {e['dma_seconds']:.2f} | "
            f"{e['overlapped_seconds']:.2f} | {e['serial_seconds']:.2f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("shapes", nargs="*", help="any of small, medium, large (default: all)")
    parser.add_argument("--full", action="store_true", help="interpret every launch")
    parser.add_argument("--transform", action="store_true",
                        help="also estimate the DF transform with gemm and transform_gemm")
    parser.add_argument("--json", type=Path, help="write the rows as JSON here")
    args = parser.parse_args(argv)
    for name in args.shapes:
        if name not in SHAPES:
            parser.error(f"unknown shape {name!r}; choose from {', '.join(SHAPES)}")
    names = args.shapes or list(SHAPES)
    rows = [estimate_shape(name, args.full) for name in names]
    print(markdown(rows))
    if args.transform:
        transform_rows = [estimate_transform(name, method) for name in names
                          for method in ("gemm", "transform_gemm")]
        print("\n" + transform_markdown(transform_rows))
        rows += transform_rows
    print(f"\n{rows[0]['estimate']['label']}; per-launch dispatch overhead not included.")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
