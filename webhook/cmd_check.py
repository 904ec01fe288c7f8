"""`gpu-admission check`: run mutate-then-validate on manifests offline, as the API server would on CREATE."""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from typing import Any

import orjson
import yaml

from cluster.pods import PodView
from policies import exceptions as exceptions_mod
from policies import inventory as inventory_mod
from policies.document import MAX_POLICY_BYTES, Policy, PolicyError, default_policy, parse_policy_text
from policies.engine import Review, ReviewContext, review
from policies.placement import Capacity
from policies.quantity import parse_bytes
from policies.subject import pod_facts
from webhook.cli import UsageError
from webhook.manifests import DEFAULT_LIMITS, Limits, ManifestError, load_objects
from webhook.reservations import Reservations
from webhook.state import capacity_of


def register(sub: Any) -> None:
    p = sub.add_parser(
        "check",
        help="run the webhook's decisions on manifests offline",
        description="Mutate then validate every object, as the API server would on CREATE. "
        "Exit 0 when all are allowed, 1 when any is denied, 2 on unreadable input or an invalid policy.",
    )
    p.add_argument("-f", "--filename", action="append", required=True, metavar="PATH",
                   help="file, directory or - for stdin (repeatable)")  # fmt: skip
    p.add_argument("--policy", metavar="FILE", help="policy document (default: the built-in policy)")
    p.add_argument("--nodes", metavar="FILE", help="Nodes (kubectl get nodes -o yaml) to decide with; Pods in it "
                   "feed the pod view like --pods")  # fmt: skip
    p.add_argument("--pods", metavar="FILE", action="append",
                   help="Pods (kubectl get pods -A -o yaml): GPUs they hold, for placement (repeatable)")  # fmt: skip
    p.add_argument("--no-mutate", action="store_true", help="validate the objects as given")
    p.add_argument("-o", "--output", choices=("text", "json", "yaml"), default="text")
    p.add_argument("--max-input", type=_size, default=DEFAULT_LIMITS.max_bytes, metavar="SIZE",
                   help="bytes read over all -f inputs, a quantity such as 64Mi (default 32Mi)")  # fmt: skip
    p.add_argument("--max-objects", type=int, default=DEFAULT_LIMITS.max_objects, metavar="N",
                   help="objects (and YAML documents) over all -f inputs (default 20000)")  # fmt: skip
    p.set_defaults(func=run)


def _size(text: str) -> int:
    try:
        return parse_bytes(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def load_policy(path: str | None) -> Policy:
    if not path:
        return default_policy()
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read(MAX_POLICY_BYTES + 1)  # the parser reports a longer one
    except OSError as exc:
        raise UsageError(f"policy {path}: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise UsageError(f"policy {path}: not UTF-8 text") from None
    try:
        return parse_policy_text(text)
    except PolicyError as exc:
        raise UsageError(f"policy {path}: {exc}") from None


# What a cluster file may hold: `kubectl get nodes,resourceslices,deviceclasses,pods -o yaml`.
CLUSTER_KINDS = ("Node", "ResourceSlice", "DeviceClass", "Pod")


def load_kinds(what: str, path: str, kinds: tuple[str, ...], expected: str = "") -> list[dict[str, Any]]:
    """The objects of a file, all of one of `kinds`; a one-line UsageError naming `what` otherwise."""
    try:
        objects = load_objects([path])
    except ManifestError as exc:
        raise UsageError(f"{what}: {exc}") from None
    other = [o for o in objects if o.get("kind") not in kinds]
    if other:
        expected = expected or " or ".join(kinds)
        raise UsageError(f"{what} {path}: expected {expected} objects, found kind {other[0].get('kind')!r}")
    return objects


def load_cluster(path: str | None, policy: Policy) -> tuple[inventory_mod.Inventory, list[dict[str, Any]]]:
    """The inventory from a nodes file, and the Pods that file also holds (kubectl get nodes,pods)."""
    if not path:
        return inventory_mod.build((), policy), []
    objects = load_kinds("nodes", path, CLUSTER_KINDS, "Node, ResourceSlice, DeviceClass (or Pod)")
    inv = inventory_mod.build_cluster(objects, policy)
    return inv, [o for o in objects if o.get("kind") == "Pod"]


def load_pods(paths: list[str] | None, extra: list[dict[str, Any]]) -> Capacity | None:
    """The pod view from --pods files (and the nodes file's Pods); None when neither gave any."""
    objects = list(extra)
    for path in paths or []:
        try:
            loaded = load_objects([path])
        except ManifestError as exc:
            raise UsageError(f"pods: {exc}") from None
        other = [o for o in loaded if o.get("kind") != "Pod"]
        if other:
            raise UsageError(f"pods {path}: expected Pod objects, found kind {other[0].get('kind')!r}")
        objects += loaded
    if not paths and not objects:
        return None
    view = PodView(pod_facts)
    view.load({str(i): o for i, o in enumerate(objects)})
    if view.skipped:
        print(f"gpu-admission: warning: skipped {view.skipped} pod entries that could not be read", file=sys.stderr)
    return capacity_of(view.snapshot())


def load_exceptions(objects: list[dict[str, Any]], now: float) -> dict[str, tuple[exceptions_mod.Exemption, ...]]:
    """The GPUPolicyExceptions among the inputs, by namespace; a malformed one is an input error (exit 2), an
    expired one is ignored with a warning, as the server does."""
    parsed = []
    for obj in objects:
        if not exceptions_mod.is_exception(obj):
            continue
        try:
            e = exceptions_mod.parse(obj)
        except exceptions_mod.ExceptionError as exc:
            _, ns, name = _key(obj)
            raise UsageError(f"{exceptions_mod.KIND} {ns}/{name} is invalid: {exc}") from None
        if e.expired(now):
            print(f"gpu-admission: warning: exception {e.ref} expired {e.until_text}: ignored", file=sys.stderr)
        parsed.append(e)
    return exceptions_mod.index(parsed)


def cel_checker() -> Callable[[str], str | None] | None:
    """A check that a DRA CEL selector parses, from cel-python when installed (the `cel` extra); the API
    server compiles the selectors of every claim, template and class it stores, so only files need it."""
    try:
        import celpy
    except ImportError:
        return None
    env = celpy.Environment()
    seen: dict[str, str | None] = {}

    def check(expression: str) -> str | None:
        if expression not in seen:
            try:
                env.compile(expression)
                seen[expression] = None
            except Exception as exc:  # celpy's parse error, or another from its parser on odd input
                column = getattr(exc, "column", None)
                seen[expression] = f"at column {column}" if isinstance(column, int) else type(exc).__name__
        return seen[expression]

    return check


def _key(obj: dict[str, Any]) -> tuple[str, str, str]:
    meta = obj.get("metadata") or {}
    return str(obj.get("kind", "")), str(meta.get("namespace") or "default"), str(meta.get("name", ""))


def element(obj: dict[str, Any], r: Review) -> dict[str, Any]:
    meta = obj.get("metadata") or {}
    return {
        "apiVersion": obj.get("apiVersion"),
        "kind": obj.get("kind"),
        "namespace": meta.get("namespace"),
        "name": meta.get("name") or meta.get("generateName"),
        "workload": r.workload,
        "allowed": r.allowed,
        "denials": [{"rule": d.rule, "message": d.message} for d in r.denials],
        "warnings": list(r.warnings),
        "mutations": list(r.mutations),
        "patch": list(r.patch),
        "object": r.object,
    }


def run(args: argparse.Namespace) -> int:
    policy = load_policy(args.policy)
    inv, node_file_pods = load_cluster(args.nodes, policy)
    capacity = load_pods(args.pods, node_file_pods)
    # Jobs pinned earlier in the input hold their GPUs for the later ones, as the server's reservations do.
    reservations = Reservations(clock=lambda: 0.0)
    try:
        objects = load_objects(args.filename, Limits(max_bytes=args.max_input, max_objects=args.max_objects))
    except ManifestError as exc:
        raise UsageError(str(exc)) from None
    index = {_key(o): o for o in objects}
    namespaces = {
        str((o.get("metadata") or {}).get("name")): (o.get("metadata") or {}).get("labels") or {}
        for o in objects
        if o.get("kind") == "Namespace"
    }

    def resolve(kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        return index.get((kind, namespace or "default", name))

    now = time.time()
    exceptions = load_exceptions(objects, now)

    cel_check = cel_checker()
    if inv.empty:
        print(
            "gpu-admission: warning: no GPU inventory (--nodes or policy pools): rack placement, sizes and MIG "
            "profiles are not checked",
            file=sys.stderr,
        )
    for w in inv.warnings:
        print(f"gpu-admission: warning: {w}", file=sys.stderr)

    out = []
    handled: list[bool] = []
    for obj in objects:
        ns = str((obj.get("metadata") or {}).get("namespace") or "default")
        ctx = ReviewContext(
            namespace_labels=namespaces.get(ns),
            resolve=resolve,
            namespace=ns,
            capacity=capacity,
            reservations=reservations.active(),
            exceptions=exceptions.get(ns, ()),
            now=now,
            cel_check=cel_check,
        )
        r = review(obj, policy=policy, inventory=inv, ctx=ctx, mutate=not args.no_mutate)
        if r.placement is not None and r.allowed:
            reservations.record(r.placement, policy.reservation_seconds)
        out.append(element(obj, r))
        handled.append(r.handled)
    if args.output == "json":
        sys.stdout.buffer.write(orjson.dumps(out, option=orjson.OPT_INDENT_2) + b"\n")
    elif args.output == "yaml":
        yaml.safe_dump(out, sys.stdout, sort_keys=False)
    else:
        _print_text(out, handled)
    return 0 if all(e["allowed"] for e in out) else 1


def _print_text(out: list[dict[str, Any]], handled: list[bool]) -> None:
    for e, known in zip(out, handled, strict=True):
        where = f"{e['namespace']}/{e['name']}" if e["namespace"] else str(e["name"])
        verdict = "ALLOW" if e["allowed"] else "DENY "
        workload = e["workload"] or "-"
        note = "" if known else "  (kind not handled: allowed untouched)"
        print(f"{verdict} {e['kind']} {where} [{workload}]{note}")
        for d in e["denials"]:
            print(f"  deny     {d['message']}")
        for w in e["warnings"]:
            print(f"  warning  {w}")
        if e["mutations"]:
            print(f"  mutated  {', '.join(e['mutations'])} ({len(e['patch'])} patch ops)")
    denied = sum(1 for e in out if not e["allowed"])
    print(f"{len(out)} objects: {len(out) - denied} allowed, {denied} denied")
