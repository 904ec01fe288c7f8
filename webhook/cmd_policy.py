"""`gpu-admission policy validate|default|diff`: check an edit offline, print the built-in policy, explain
what an edit changes."""

from __future__ import annotations

import argparse
import sys
from typing import Any

import yaml

from policies.document import MAX_POLICY_BYTES, PolicyError, default_policy, default_policy_text, parse_policy_text
from policies.policydiff import describe_changes
from webhook.cli import UsageError


def register(sub: Any) -> None:
    p = sub.add_parser("policy", help="validate, print or compare policy documents")
    psub = p.add_subparsers(dest="policy_command", metavar="SUBCOMMAND", required=True)
    v = psub.add_parser("validate", help="check a policy file; every error names its field path")
    v.add_argument("file", metavar="FILE", help="policy YAML, or - for stdin")
    v.set_defaults(func=_validate)
    d = psub.add_parser("default", help="print the built-in default policy")
    d.set_defaults(func=_default)
    df = psub.add_parser("diff", help="explain what changes from OLD to NEW")
    df.add_argument("old", metavar="OLD")
    df.add_argument("new", metavar="NEW")
    df.set_defaults(func=_diff)
    n = psub.add_parser(
        "native",
        help="print Validating/MutatingAdmissionPolicies (+ bindings) for what the API server can run itself",
        description="Rules that need no node inventory, pod view or other object, as ValidatingAdmissionPolicies "
        "and bindings from the policy's actions, enforcement modes and namespace label, and such mutations as "
        "MutatingAdmissionPolicies; serve --native [--native-mutations] then skips them (docs/policy.md, "
        "'Native policies').",
    )
    n.add_argument("file", metavar="FILE", nargs="?", help="policy YAML, or - for stdin (default: the built-in)")
    n.add_argument("--exclude-namespace", action="append", metavar="NS",
                   help="namespaces no binding matches (repeatable; default: kube-system, kube-node-lease, "
                   "kube-public, gpu-admission)")  # fmt: skip
    n.add_argument("--no-mutations", action="store_true",
                   help="ValidatingAdmissionPolicies only: for clusters before Kubernetes 1.36, which do not "
                   "serve MutatingAdmissionPolicy (then serve without --native-mutations)")  # fmt: skip
    n.add_argument("--explain", action="store_true", help="say per rule and mutation what is generated and why not")
    n.set_defaults(func=_native)
    dc = psub.add_parser(
        "deviceclasses",
        help="print the DeviceClasses gpu-memory asks on a DRA cluster: one per GPU memory size and MIG profile",
        description="From the NVIDIA DRA driver's ResourceSlices (kubectl get resourceslices -o yaml; Nodes and "
        "DeviceClasses in the file are ignored): one DeviceClass per distinct whole-GPU memory capacity (CEL: at "
        "least that much) and one per MIG profile, labelled gpu-admission.io/gpu-memory-tier. Applied, they let "
        "the gpu-memory-class mutation rewrite a gpu-memory pod's nvidia.com/gpu to the best-fit class "
        "(docs/policy.md, 'gpu-memory on DRA clusters'). Regenerate when new GPU models or MIG profiles appear.",
    )
    dc.add_argument("--nodes", required=True, metavar="FILE",
                    help="ResourceSlices (and optionally Nodes, DeviceClasses), or - for stdin")  # fmt: skip
    dc.set_defaults(func=_deviceclasses)


def _read(path: str) -> str:
    if path == "-":
        return sys.stdin.read(MAX_POLICY_BYTES + 1)  # the parser reports a longer one
    try:
        with open(path, encoding="utf-8") as f:
            return f.read(MAX_POLICY_BYTES + 1)
    except OSError as exc:
        raise UsageError(f"{path}: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise UsageError(f"{path}: not UTF-8 text") from None


def _validate(args: argparse.Namespace) -> int:
    text = _read(args.file)
    try:
        policy = parse_policy_text(text)
    except PolicyError as exc:
        for err in exc.errors:
            print(f"{args.file}: {err}", file=sys.stderr)
        return 1
    print(f"{args.file}: valid policy ({policy.hash})")
    return 0


def _default(args: argparse.Namespace) -> int:
    sys.stdout.write(default_policy_text())
    return 0


def _diff(args: argparse.Namespace) -> int:
    policies = []
    for path in (args.old, args.new):
        try:
            policies.append(parse_policy_text(_read(path)))
        except PolicyError as exc:
            raise UsageError(f"{path}: {exc}") from None
    old, new = policies
    lines = describe_changes(old, new)
    if not lines:
        print("no change in behaviour")
        return 0
    for line in lines:
        print(line)
    return 0


def _native(args: argparse.Namespace) -> int:
    from policies import native  # lazily: it pulls in the whole engine

    try:
        policy = parse_policy_text(_read(args.file)) if args.file else default_policy()
    except PolicyError as exc:
        raise UsageError(f"{args.file}: {exc}") from None
    if args.explain:
        for rule, what in native.report(policy, mutations=not args.no_mutations):
            print(f"{rule}: {what}")
        return 0
    excluded = tuple(args.exclude_namespace or native.DEFAULT_EXCLUDED)
    objects = native.generate(policy, excluded, mutations=not args.no_mutations)
    header = f"# gpu-admission policy native ({policy.hash}): {len(objects)} objects; apply with kubectl apply -f -\n"
    sys.stdout.write(header + yaml.safe_dump_all(objects, sort_keys=False, width=120))
    return 0


def _deviceclasses(args: argparse.Namespace) -> int:
    from policies import dra
    from webhook.cmd_check import CLUSTER_KINDS, load_kinds

    objects = load_kinds("nodes", args.nodes, CLUSTER_KINDS, "ResourceSlice, Node or DeviceClass")
    classes = dra.tier_classes(o for o in objects if o.get("kind") == "ResourceSlice")
    if not classes:
        print(
            f"gpu-admission: {args.nodes}: no GPU or MIG device in a {dra.NVIDIA_DRIVER} ResourceSlice: nothing to "
            "generate",
            file=sys.stderr,
        )
        return 1
    header = f"# gpu-admission policy deviceclasses: {len(classes)} DeviceClasses; apply with kubectl apply -f -\n"
    sys.stdout.write(header + yaml.safe_dump_all(classes, sort_keys=False, width=200))
    return 0
