"""`gpu-admission estimate`: the all-reduce cost of a job in one node, one rack and across racks.

Operators use it to reproduce a penalty the webhook quoted in a denial, or to see what a different
fabric (bandwidths, oversubscription, latency) would change. The model and its defaults live in
`policies/comm.py`; this module only parses flags and prints.

Defaults match the built-in policy (`comm:` section): 16 MiB messages, NVLink 400 Gb/s, network 200 Gb/s
per GPU, 2:1 cross-rack oversubscription, no latency terms. `--message-size` takes a Kubernetes quantity
(`16Mi`, `16M`) and, for convenience, the byte spellings `16MiB`, `16MB` and `100B`.
"""

from __future__ import annotations

import argparse
import json
import math
from typing import Any

from policies.comm import (
    DEFAULT_BANDWIDTHS,
    DEFAULT_MESSAGE_BYTES,
    PLACEMENTS,
    Bandwidths,
    Estimate,
    level_phrase,
    nvlink_domain_penalty,
    penalty_phrase,
    placement_estimate,
)
from policies.quantity import QuantityError, format_bytes, parse_bytes
from webhook.cli import UsageError

OUTPUTS = ("table", "json")


def register(subparsers: Any) -> None:
    d = DEFAULT_BANDWIDTHS
    p = subparsers.add_parser(
        "estimate",
        help="estimate the all-reduce cost of a job's placement (node, rack, across racks)",
        description="Estimate all-reduce time of a multi-GPU job placed in one node, in one rack, and "
        "across two racks, with the ratio to the best placement (alpha-beta ring model; see "
        "policies/comm.py for the assumptions).",
    )
    # Values are parsed in `run`, not by argparse, so that a bad value is a one-line error (exit 2).
    p.add_argument("--gpus", metavar="N", help="total GPUs of the job (required)")
    p.add_argument("--gpus-per-node", metavar="N", help="GPUs per node (required)")
    p.add_argument(
        "--message-size",
        metavar="SIZE",
        default=format_bytes(DEFAULT_MESSAGE_BYTES),
        help="bytes all-reduced per step, e.g. 16MiB, 16Mi, 16M (default: %(default)s)",
    )
    p.add_argument(
        "--nvlink-gbps",
        metavar="GBPS",
        default=f"{d.nvlink_gbps:g}",
        help="NVLink Gb/s per GPU per direction (default: %(default)s)",
    )
    p.add_argument(
        "--network-gbps",
        metavar="GBPS",
        default=f"{d.network_gbps:g}",
        help="network Gb/s per GPU, one NIC each (default: %(default)s)",
    )
    p.add_argument(
        "--oversubscription",
        metavar="RATIO",
        default=f"{d.cross_rack_oversubscription:g}",
        help="cross-rack oversubscription, e.g. 2 for 2:1 (1 = non-blocking; default: %(default)s)",
    )
    p.add_argument(
        "--alpha-us",
        metavar="US",
        default="0",
        help="latency per ring step in µs, NVLink and network (default: %(default)s)",
    )
    p.add_argument(
        "--hop-us",
        metavar="US",
        default="0",
        help="extra µs per inter-node step that crosses racks (default: %(default)s)",
    )
    p.add_argument(
        "--nvlink-domain",
        action="store_true",
        help="the job runs in a multi-node NVLink domain (GB200 NVL72 clique): also estimate splitting it over two",
    )
    p.add_argument("-o", "--output", metavar="FORMAT", default="table", help="table (default) or json")
    p.set_defaults(func=run)


def _count(flag: str, text: str | None) -> int:
    if text is None:
        raise UsageError(f"{flag} is required")
    if not (text.isascii() and text.isdigit()) or int(text) < 1:
        raise UsageError(f"{flag}: not a whole number ≥ 1: {text!r}")
    return int(text)


def _number(flag: str, text: str, *, minimum: float, strict: bool = False) -> float:
    """A finite float ≥ `minimum` (> when `strict`); a one-line UsageError naming the flag otherwise."""
    try:
        value = float(text)
    except ValueError:
        raise UsageError(f"{flag}: not a number: {text!r}") from None
    if not math.isfinite(value) or value < minimum or (strict and value == minimum):
        relation = ">" if strict else "≥"
        raise UsageError(f"{flag}: must be a finite number {relation} {minimum:g}, got {text!r}")
    return value


def _size(text: str) -> int:
    """A Kubernetes quantity, also accepting a trailing `B` of byte spellings (`16MiB`, `16MB`, `100B`)."""
    quantity = text
    if quantity.endswith("iB") or (
        quantity.endswith("B") and len(quantity) > 1 and (quantity[-2].isdigit() or quantity[-2] in "kMGTPE")
    ):
        quantity = quantity[:-1]
    try:
        size = parse_bytes(quantity)
    except QuantityError:
        raise UsageError(f"--message-size: not a size: {text!r} (use e.g. 16MiB, 16Mi, 16M or 16777216)") from None
    if size < 1:
        raise UsageError(f"--message-size: must be at least 1 byte, got {text!r}")
    return size


def _inputs(args: argparse.Namespace) -> tuple[int, int, int, Bandwidths, str]:
    if args.output not in OUTPUTS:
        raise UsageError(f"-o/--output: must be table or json, got {args.output!r}")
    gpus = _count("--gpus", args.gpus)
    per_node = _count("--gpus-per-node", args.gpus_per_node)
    size = _size(args.message_size)
    alpha = _number("--alpha-us", args.alpha_us, minimum=0)
    bandwidths = Bandwidths(
        nvlink_gbps=_number("--nvlink-gbps", args.nvlink_gbps, minimum=0, strict=True),
        network_gbps=_number("--network-gbps", args.network_gbps, minimum=0, strict=True),
        cross_rack_oversubscription=_number("--oversubscription", args.oversubscription, minimum=1),
        alpha_nvlink_us=alpha,
        alpha_network_us=alpha,
        cross_rack_hop_us=_number("--hop-us", args.hop_us, minimum=0),
    )
    return gpus, per_node, size, bandwidths, args.output


def _rows(estimate: Estimate) -> list[dict[str, Any]]:
    times = (estimate.intra_node_ms, estimate.intra_rack_ms, estimate.cross_rack_ms)
    ratios = (estimate.intra_node_ratio, estimate.intra_rack_ratio, estimate.cross_rack_ratio)
    spread = (1, estimate.nodes, estimate.nodes)
    racks = (1, 1, 2)
    return [
        {
            "placement": name,
            "feasible": ms is not None,
            "nodes": nodes if ms is not None else None,
            "racks": rack if ms is not None else None,
            "ms": ms,
            "ratio": ratio,
        }
        for name, ms, ratio, nodes, rack in zip(PLACEMENTS, times, ratios, spread, racks, strict=True)
    ]


def _why_infeasible(name: str, estimate: Estimate) -> str:
    if name == "intra-node":
        return f"n/a ({estimate.total_gpus} GPUs > {estimate.gpus_per_node} per node)"
    return "n/a (1 GPU: nothing to spread)"


def _clique_line(estimate: Estimate) -> str:
    """Across two NVLink cliques vs in one: NVLink stops at the clique edge (docs/policy.md, NCCL)."""
    return level_phrase(
        "nvlink",
        "NVLink cliques",
        estimate.size_bytes,
        estimate.total_gpus,
        estimate.gpus_per_node,
        estimate.bandwidths,
    )


def _table(estimate: Estimate, clique: bool = False) -> str:
    header = (
        f"{estimate.total_gpus} GPUs, {estimate.gpus_per_node} per node, all-reduce of "
        f"{estimate.size_bytes} bytes ({format_bytes(estimate.size_bytes)})"
    )
    lines = [header, f"{'PLACEMENT':<12}{'NODES':>6}{'RACKS':>6}{'ALL-REDUCE':>14}{'VS BEST':>9}"]
    for row in _rows(estimate):
        if not row["feasible"]:
            lines.append(f"{row['placement']:<12}{'-':>6}{'-':>6}  {_why_infeasible(row['placement'], estimate)}")
            continue
        best = "  (best)" if row["placement"] == estimate.best else ""
        lines.append(
            f"{row['placement']:<12}{row['nodes']:>6}{row['racks']:>6}{row['ms']:>11.3f} ms{row['ratio']:>8.2f}×{best}"
        )
    lines.append(penalty_phrase(estimate))
    if clique:
        lines.append(_clique_line(estimate))
    lines.append(f"assumptions: {estimate.assumptions}")
    return "\n".join(lines)


def _json(estimate: Estimate, clique: bool = False) -> str:
    bw = estimate.bandwidths
    document = {
        "gpus": estimate.total_gpus,
        "gpusPerNode": estimate.gpus_per_node,
        "messageSizeBytes": estimate.size_bytes,
        "bandwidths": {
            "nvlinkGbps": bw.nvlink_gbps,
            "networkGbps": bw.network_gbps,
            "crossRackOversubscription": bw.cross_rack_oversubscription,
            "alphaNvlinkUs": bw.alpha_nvlink_us,
            "alphaNetworkUs": bw.alpha_network_us,
            "crossRackHopUs": bw.cross_rack_hop_us,
        },
        "placements": _rows(estimate),
        "best": estimate.best,
        "crossRackPenalty": estimate.cross_rack_penalty,
        "penalty": penalty_phrase(estimate),
        "assumptions": estimate.assumptions,
    }
    if clique:
        document["nvlinkDomainPenalty"] = nvlink_domain_penalty(
            estimate.size_bytes, estimate.total_gpus, estimate.bandwidths
        )
        document["nvlinkDomainPhrase"] = _clique_line(estimate)
    return json.dumps(document, indent=2, ensure_ascii=False)


def run(args: argparse.Namespace) -> int:
    gpus, per_node, size, bandwidths, output = _inputs(args)
    estimate = placement_estimate(size, gpus, per_node, bandwidths)
    clique = bool(args.nvlink_domain)
    print(_json(estimate, clique) if output == "json" else _table(estimate, clique))
    return 0
