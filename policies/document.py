"""The policy document: schema, validation that names the field path of every error, and compilation.

A policy is YAML (one ConfigMap key, or a file). Validation collects every error instead of stopping at the
first, so an operator fixing an edit sees all of them at once. Compilation turns the document into a frozen
`Policy` that the engine reads on the hot path without further checks.
"""

from __future__ import annotations

import hashlib
import importlib.resources
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import yaml

from policies import comm
from policies.limits import MAX_DEPTH, LimitError, check_yaml, json_too_deep
from policies.quantity import QuantityError, parse_bytes

API_VERSION = "gpu-admission.io/v1alpha1"
KIND = "Policy"

ACTIONS = ("enforce", "warn", "audit", "off")
ENFORCEMENT_MODES = ACTIONS
RULE_IDS = (
    "training-same-rack",
    "training-topology-scheduler",
    "scheduler-topology-keys",
    "training-elastic-shrink",
    "training-queue-priority",
    "shared-gpu-single",
    "online-no-timeslice",
    "inference-warm-pool",
    "gpu-request-fits",
    "dra-claims",
    "gpu-admission-annotations",
)
MUTATION_IDS = (
    "training-pool",
    "training-rack",
    "training-node-pack",
    "reserved-keep-off",
    "job-size",
    "inference-spread",
    "inference-group",
    "gpu-slice",
    "gpu-memory-class",
    "online-exclusive",
    "gpu-toleration",
    "scheduler-queue",
)
QUEUE_SYSTEMS = ("", "kueue", "volcano", "kai")
SHARING = ("none", "time-slicing", "mps")
MIG_STRATEGIES = ("none", "single", "mixed")

# Limits on a policy document. Every number is finite and within a range, every list and string bounded:
# a policy that validates must never make the server fail later (a `pools[].nodes` of 10^8 once took the
# reload past 600 MiB; an infinite bandwidth made a rule raise on every review). One ConfigMap holds at most
# 1 MiB; the ranges are far beyond any real cluster (docs/policy.md, "Limits").
MAX_POLICY_BYTES = 2**20
MAX_LIST = 1000  # pools, tolerations, topologySchedulers; also entries of a nodeSelector or migProfiles
MAX_STRING = 1024
MAX_POOL_NODES = 10_000  # declared nodes, per pool and over all pools
MAX_GPUS_PER_NODE = 64
MAX_REPLICAS = 1024  # time-slicing / MPS sharers per GPU
MAX_MIG_SLICES = 1024
MAX_WARM_POOL = 100_000
MAX_MESSAGE_BYTES = 2**40  # an all-reduce message of 1 TiB
MAX_GBPS = 100_000.0  # 100 Tb/s per GPU per direction
MAX_OVERSUBSCRIPTION = 1000.0
MAX_RESERVATION_SECONDS = 86_400  # placement holds GPUs for a pinned job this long at most: a day


class PolicyError(ValueError):
    """An invalid policy document; `errors` holds one `path: message` string per problem."""

    def __init__(self, errors: list[str]) -> None:
        self.errors = errors
        first = errors[0] if errors else "invalid policy"
        more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
        super().__init__(f"{first}{more}")


@dataclass(frozen=True)
class Pool:
    """A declared group of GPU nodes, selected by labels."""

    name: str
    node_selector: Mapping[str, str]
    product: str = ""
    gpus_per_node: int = 0
    nodes: int = 1
    rack: str = ""
    sharing: str = "none"
    replicas: int = 1
    mig_strategy: str = "none"
    mig_profiles: Mapping[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class Toleration:
    key: str
    operator: str
    value: str
    effect: str

    def as_json(self) -> dict[str, str]:
        out = {"key": self.key, "operator": self.operator}
        if self.value:
            out["value"] = self.value
        if self.effect:
            out["effect"] = self.effect
        return out


@dataclass(frozen=True)
class CommSettings:
    message_bytes: int = 16 * 2**20
    nvlink_gbps: float = 400.0
    network_gbps: float = 200.0
    cross_rack_oversubscription: float = 2.0

    def bandwidths(self) -> comm.Bandwidths:
        return comm.Bandwidths(
            nvlink_gbps=self.nvlink_gbps,
            network_gbps=self.network_gbps,
            cross_rack_oversubscription=self.cross_rack_oversubscription,
        )


@dataclass(frozen=True)
class Policy:
    """A validated, compiled policy. `hash` identifies the exact document text in decisions and logs."""

    failure_mode: str
    default_enforcement: str
    rules: Mapping[str, str]
    mutations: Mapping[str, bool]
    rack: str
    pools: tuple[Pool, ...]
    training_pool: str
    scheduler_name: str
    queue_system: str
    queue_name: str
    priority_class: str
    topology_schedulers: frozenset[str]
    warm_pool: int
    spread_when_unsatisfiable: str
    spread_zones: bool
    tolerations: tuple[Toleration, ...]
    comm: CommSettings
    hash: str
    document: Mapping[str, Any]
    # placement.whenNoDomainFits (prefer | deny) and how long a pinned job's GPUs stay reserved
    when_no_domain_fits: str = "prefer"
    reservation_seconds: float = 120.0
    # ... and how long a reservation outlives signs that its gang will not bind soon (webhook/reservations.py):
    # no pod of the job seen yet; pods gated or tried by no scheduler, with no bind of the job meanwhile
    no_pods_grace_seconds: float = 15.0
    waiting_grace_seconds: float = 30.0
    # placement.gangSchedulers: express the same-rack constraint through these instead of podAffinity
    gang_kueue: bool = False
    gang_volcano: bool = False
    gang_kai_topology: str = ""
    gang_workload: bool = False  # Kubernetes' own Workload API: a Job's spec.scheduling (gang + topology)
    levels: tuple[str, ...] = ()  # topology.levels, narrowest first; () = auto-detected

    def pool(self, name: str) -> Pool | None:
        for p in self.pools:
            if p.name == name:
                return p
        return None


class _Checker:
    """Walks the document, recording `path: message` errors."""

    def __init__(self) -> None:
        self.errors: list[str] = []

    def err(self, path: str, msg: str) -> None:
        self.errors.append(f"{path}: {msg}")

    def mapping(self, doc: Mapping[str, Any], key: str, path: str) -> Mapping[str, Any]:
        value = doc.get(key, {})
        if value is None:
            return {}
        if not isinstance(value, Mapping):
            self.err(_join(path, key), f"must be a mapping, got {_type(value)}")
            return {}
        return value

    def known(self, doc: Mapping[str, Any], allowed: tuple[str, ...], path: str) -> None:
        for key in doc:
            if key not in allowed:
                name = str(key)
                hint = _closest(name, allowed)
                shown = name if name.isprintable() else repr(name)[1:-1]  # a line break in a key stays escaped
                self.err(_join(path, shown), "unknown field" + (f" (did you mean {hint!r}?)" if hint else ""))

    def choice(self, doc: Mapping[str, Any], key: str, allowed: tuple[str, ...], default: str, path: str) -> str:
        value = doc.get(key, default)
        if value is None:
            return default
        if not isinstance(value, str) or value not in allowed:
            self.err(_join(path, key), f"must be one of {', '.join(repr(a) for a in allowed)}, got {value!r}")
            return default
        return value

    def string(self, doc: Mapping[str, Any], key: str, default: str, path: str) -> str:
        value = doc.get(key, default)
        if value is None:
            return default
        if not isinstance(value, str):
            self.err(_join(path, key), f"must be a string, got {_type(value)}")
            return default
        if len(value) > MAX_STRING:
            self.err(_join(path, key), f"must be at most {MAX_STRING} characters, got {len(value)}")
            return default
        return value

    def items(self, value: list[Any] | Mapping[str, Any], path: str, limit: int = MAX_LIST) -> bool:
        """Whether a list or mapping is within its length limit (recording the error when not)."""
        if len(value) > limit:
            self.err(path, f"must have at most {limit} entries, got {len(value)}")
            return False
        return True

    def boolean(self, doc: Mapping[str, Any], key: str, default: bool, path: str) -> bool:
        value = doc.get(key, default)
        if not isinstance(value, bool):
            self.err(_join(path, key), f"must be true or false, got {value!r}")
            return default
        return value

    def integer(
        self, doc: Mapping[str, Any], key: str, default: int, path: str, minimum: int = 0, *, maximum: int
    ) -> int:
        value = doc.get(key, default)
        if isinstance(value, bool) or not isinstance(value, int):
            self.err(_join(path, key), f"must be an integer, got {_short(value)}")
            return default
        if not minimum <= value <= maximum:
            self.err(_join(path, key), f"must be between {minimum} and {maximum}, got {_short(value)}")
            return default
        return value

    def number(
        self, doc: Mapping[str, Any], key: str, default: float, path: str, *, maximum: float, at_least: float = 0.0
    ) -> float:
        """A finite number in (0, maximum], or in [at_least, maximum] when `at_least` is given."""
        value = doc.get(key, default)
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
            self.err(_join(path, key), f"must be a finite number, got {_short(value)}")
            return default
        if at_least and not at_least <= value <= maximum:
            self.err(_join(path, key), f"must be at least {at_least:g} and at most {maximum:g}, got {_short(value)}")
            return default
        if not 0 < value <= maximum:
            self.err(_join(path, key), f"must be positive and at most {maximum:g}, got {_short(value)}")
            return default
        return float(value)


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def _short(value: object) -> str:
    """A value for an error message, cut short: an error line never carries a megabyte of input."""
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _type(value: object) -> str:
    return {dict: "mapping", list: "list", str: "string", int: "integer", float: "number", bool: "boolean"}.get(
        type(value), type(value).__name__
    )


def _closest(word: str, options: tuple[str, ...]) -> str | None:
    """A cheap 'did you mean': the option sharing the longest common prefix, if it is a good share."""
    best, score = None, 0
    for opt in options:
        n = 0
        for a, b in zip(word.lower(), opt.lower(), strict=False):
            if a != b:
                break
            n += 1
        if n > score:
            best, score = opt, n
    return best if best is not None and score >= max(3, len(best) // 2) else None


_TOP = (
    "apiVersion",
    "kind",
    "failureMode",
    "defaultEnforcement",
    "rules",
    "mutations",
    "topology",
    "pools",
    "training",
    "inference",
    "gpuNodes",
    "comm",
    "placement",
)


def _levels(c: _Checker, raw: Any, rack: str) -> tuple[str, ...]:
    """topology.levels: node label keys, narrowest first, each once; the rack (when set) among them."""
    if not isinstance(raw, list) or not all(isinstance(k, str) and k for k in raw):
        c.err("topology.levels", "must be a list of node label keys, narrowest first")
        return ()
    if len(set(raw)) != len(raw):
        c.err("topology.levels", "lists a key twice")
    if raw and rack != "auto" and rack not in raw:
        c.err("topology.levels", f"must include topology.rack {rack!r}")
    return tuple(raw)


def compile_policy(doc: object, text: str | None = None) -> Policy:
    """Validate a parsed policy document and compile it; raise PolicyError listing every problem."""
    c = _Checker()
    if not isinstance(doc, Mapping):
        raise PolicyError([f"(root): must be a mapping, got {_type(doc)}"])
    if json_too_deep(doc):
        raise PolicyError([f"(root): nests deeper than {MAX_DEPTH} levels"])
    c.known(doc, _TOP, "")
    if doc.get("apiVersion") != API_VERSION:
        c.err("apiVersion", f"must be {API_VERSION!r}, got {doc.get('apiVersion')!r}")
    if doc.get("kind") != KIND:
        c.err("kind", f"must be {KIND!r}, got {doc.get('kind')!r}")
    failure_mode = c.choice(doc, "failureMode", ("closed", "open"), "closed", "")
    default_enf = c.choice(doc, "defaultEnforcement", ENFORCEMENT_MODES, "enforce", "")

    rules_doc = c.mapping(doc, "rules", "")
    c.known(rules_doc, RULE_IDS, "rules")
    default_rules = _default_document_rules()
    rules = {r: c.choice(rules_doc, r, ACTIONS, default_rules.get(r, "enforce"), "rules") for r in RULE_IDS}

    mut_doc = c.mapping(doc, "mutations", "")
    c.known(mut_doc, MUTATION_IDS, "mutations")
    mutations = {m: c.boolean(mut_doc, m, True, "mutations") for m in MUTATION_IDS}

    topo = c.mapping(doc, "topology", "")
    c.known(topo, ("rack", "levels"), "topology")
    rack = c.string(topo, "rack", "auto", "topology")
    if not rack:
        c.err("topology.rack", "must be 'auto' or a node label key")
    levels = _levels(c, topo.get("levels", []), rack)

    pools = _pools(c, doc.get("pools", []))

    tr = c.mapping(doc, "training", "")
    c.known(tr, ("pool", "schedulerName", "queue", "priorityClassName", "topologySchedulers"), "training")
    training_pool = c.string(tr, "pool", "", "training")
    if training_pool and training_pool not in {p.name for p in pools}:
        c.err("training.pool", f"names no declared pool: {training_pool!r}")
    scheduler_name = c.string(tr, "schedulerName", "", "training")
    priority_class = c.string(tr, "priorityClassName", "", "training")
    queue = c.mapping(tr, "queue", "training")
    c.known(queue, ("system", "name"), "training.queue")
    queue_system = c.choice(queue, "system", QUEUE_SYSTEMS, "", "training.queue")
    queue_name = c.string(queue, "name", "", "training.queue")
    if bool(queue_system) != bool(queue_name):
        c.err("training.queue", "system and name go together: set both or neither")
    ts = tr.get("topologySchedulers", ["volcano", "kai-scheduler"])
    if not isinstance(ts, list) or not all(isinstance(s, str) and 0 < len(s) <= MAX_STRING for s in ts):
        c.err("training.topologySchedulers", "must be a list of scheduler names")
        ts = []
    elif not c.items(ts, "training.topologySchedulers"):
        ts = []

    inf = c.mapping(doc, "inference", "")
    c.known(inf, ("warmPool", "spread"), "inference")
    warm_pool = c.integer(inf, "warmPool", 1, "inference", maximum=MAX_WARM_POOL)
    spread = c.mapping(inf, "spread", "inference")
    c.known(spread, ("whenUnsatisfiable", "zones"), "inference.spread")
    when = c.choice(
        spread, "whenUnsatisfiable", ("ScheduleAnyway", "DoNotSchedule"), "ScheduleAnyway", "inference.spread"
    )
    zones = c.boolean(spread, "zones", True, "inference.spread")

    gn = c.mapping(doc, "gpuNodes", "")
    c.known(gn, ("tolerations",), "gpuNodes")
    tolerations = _tolerations(c, gn.get("tolerations", []))

    cm = c.mapping(doc, "comm", "")
    c.known(cm, ("messageSize", "nvlinkGbps", "networkGbps", "crossRackOversubscription"), "comm")
    message_bytes = 16 * 2**20
    if "messageSize" in cm:
        try:
            raw_size = cm["messageSize"]
            if isinstance(raw_size, float) and not math.isfinite(raw_size):
                raise QuantityError(f"must be a finite size, got {raw_size!r}")
            message_bytes = parse_bytes(raw_size)
            if not 0 < message_bytes <= MAX_MESSAGE_BYTES:
                c.err("comm.messageSize", f"must be positive and at most 1Ti, got {_short(raw_size)}")
                message_bytes = 16 * 2**20
        except (QuantityError, OverflowError) as exc:
            c.err("comm.messageSize", str(exc) if isinstance(exc, QuantityError) else "must be a finite size")
    comm = CommSettings(
        message_bytes=message_bytes,
        nvlink_gbps=c.number(cm, "nvlinkGbps", 400.0, "comm", maximum=MAX_GBPS),
        network_gbps=c.number(cm, "networkGbps", 200.0, "comm", maximum=MAX_GBPS),
        # At least 1: the comm model divides the network bandwidth by it (1 is a non-blocking fabric); below 1
        # the model refuses it, and the penalty would drop out of every message and /readyz.
        cross_rack_oversubscription=c.number(
            cm, "crossRackOversubscription", 2.0, "comm", maximum=MAX_OVERSUBSCRIPTION, at_least=1.0
        ),
    )

    pl = c.mapping(doc, "placement", "")
    c.known(
        pl,
        ("whenNoDomainFits", "reservationSeconds", "noPodsGraceSeconds", "waitingGraceSeconds", "gangSchedulers"),
        "placement",
    )
    when_no_fit = c.choice(pl, "whenNoDomainFits", ("prefer", "deny"), "prefer", "placement")
    reservation_seconds = c.integer(
        pl, "reservationSeconds", 120, "placement", minimum=1, maximum=MAX_RESERVATION_SECONDS
    )
    no_pods_grace = c.integer(pl, "noPodsGraceSeconds", 15, "placement", minimum=1, maximum=MAX_RESERVATION_SECONDS)
    waiting_grace = c.integer(pl, "waitingGraceSeconds", 30, "placement", minimum=1, maximum=MAX_RESERVATION_SECONDS)
    gang = c.mapping(pl, "gangSchedulers", "placement")
    c.known(gang, ("kueue", "volcano", "kaiTopology", "workload"), "placement.gangSchedulers")
    gang_kueue = c.boolean(gang, "kueue", False, "placement.gangSchedulers")
    gang_volcano = c.boolean(gang, "volcano", False, "placement.gangSchedulers")
    gang_kai_topology = c.string(gang, "kaiTopology", "", "placement.gangSchedulers")
    gang_workload = c.boolean(gang, "workload", False, "placement.gangSchedulers")

    if c.errors:
        raise PolicyError(c.errors)
    canonical = text if text is not None else yaml.safe_dump(dict(doc), sort_keys=True)
    return Policy(
        failure_mode=failure_mode,
        default_enforcement=default_enf,
        rules=rules,
        mutations=mutations,
        rack=rack,
        levels=levels,
        pools=pools,
        training_pool=training_pool,
        scheduler_name=scheduler_name,
        queue_system=queue_system,
        queue_name=queue_name,
        priority_class=priority_class,
        topology_schedulers=frozenset(ts),
        warm_pool=warm_pool,
        spread_when_unsatisfiable=when,
        spread_zones=zones,
        tolerations=tolerations,
        comm=comm,
        hash="sha256:" + hashlib.sha256(canonical.encode()).hexdigest()[:16],
        document=doc,
        when_no_domain_fits=when_no_fit,
        reservation_seconds=float(reservation_seconds),
        no_pods_grace_seconds=float(no_pods_grace),
        waiting_grace_seconds=float(waiting_grace),
        gang_kueue=gang_kueue,
        gang_volcano=gang_volcano,
        gang_kai_topology=gang_kai_topology,
        gang_workload=gang_workload,
    )


def _pools(c: _Checker, raw: object) -> tuple[Pool, ...]:
    if raw is None:
        return ()
    if not isinstance(raw, list):
        c.err("pools", f"must be a list, got {_type(raw)}")
        return ()
    if not c.items(raw, "pools"):
        return ()
    out: list[Pool] = []
    names: set[str] = set()
    fields = (
        "name",
        "nodeSelector",
        "product",
        "gpusPerNode",
        "nodes",
        "rack",
        "sharing",
        "replicas",
        "migStrategy",
        "migProfiles",
    )
    for i, item in enumerate(raw):
        path = f"pools[{i}]"
        if not isinstance(item, Mapping):
            c.err(path, f"must be a mapping, got {_type(item)}")
            continue
        c.known(item, fields, path)
        name = c.string(item, "name", "", path)
        if not name:
            c.err(f"{path}.name", "is required")
        elif name in names:
            c.err(f"{path}.name", f"duplicate pool name {name!r}")
        names.add(name)
        sel = item.get("nodeSelector")
        if (
            not isinstance(sel, Mapping)
            or not sel
            or not all(isinstance(k, str) and isinstance(v, str) for k, v in sel.items())
        ):
            c.err(f"{path}.nodeSelector", "must be a non-empty mapping of label keys to string values")
            sel = {}
        elif not c.items(sel, f"{path}.nodeSelector") or any(len(k) + len(v) > MAX_STRING for k, v in sel.items()):
            if len(sel) <= MAX_LIST:
                c.err(f"{path}.nodeSelector", f"keys and values must be at most {MAX_STRING} characters")
            sel = {}
        profiles = item.get("migProfiles", {}) or {}
        if not isinstance(profiles, Mapping) or not all(
            isinstance(k, str) and len(k) <= MAX_STRING and isinstance(v, int) and not isinstance(v, bool)
            for k, v in profiles.items()
        ):
            c.err(f"{path}.migProfiles", "must map MIG profile names (e.g. 1g.10gb) to slice counts")
            profiles = {}
        elif not c.items(profiles, f"{path}.migProfiles"):
            profiles = {}
        elif any(not 0 <= v <= MAX_MIG_SLICES for v in profiles.values()):
            c.err(f"{path}.migProfiles", f"slice counts must be between 0 and {MAX_MIG_SLICES}")
            profiles = {}
        out.append(
            Pool(
                name=name,
                node_selector=dict(sel),
                product=c.string(item, "product", "", path),
                gpus_per_node=c.integer(item, "gpusPerNode", 0, path, maximum=MAX_GPUS_PER_NODE),
                nodes=c.integer(item, "nodes", 1, path, minimum=1, maximum=MAX_POOL_NODES),
                rack=c.string(item, "rack", "", path),
                sharing=c.choice(item, "sharing", SHARING, "none", path),
                replicas=c.integer(item, "replicas", 1, path, minimum=1, maximum=MAX_REPLICAS),
                mig_strategy=c.choice(item, "migStrategy", MIG_STRATEGIES, "none", path),
                mig_profiles=dict(profiles),
            )
        )
    if sum(p.nodes for p in out) > MAX_POOL_NODES:
        c.err("pools", f"declare at most {MAX_POOL_NODES} nodes in all, got {sum(p.nodes for p in out)}")
    return tuple(out)


def _tolerations(c: _Checker, raw: object) -> tuple[Toleration, ...]:
    if raw is None:
        return ()
    if not isinstance(raw, list):
        c.err("gpuNodes.tolerations", f"must be a list, got {_type(raw)}")
        return ()
    if not c.items(raw, "gpuNodes.tolerations"):
        return ()
    out = []
    for i, item in enumerate(raw):
        path = f"gpuNodes.tolerations[{i}]"
        if not isinstance(item, Mapping):
            c.err(path, "must be a mapping")
            continue
        c.known(item, ("key", "operator", "value", "effect"), path)
        op = c.choice(item, "operator", ("Exists", "Equal"), "Equal", path)
        effect = c.choice(item, "effect", ("", "NoSchedule", "PreferNoSchedule", "NoExecute"), "", path)
        key = c.string(item, "key", "", path)
        value = c.string(item, "value", "", path)
        if op == "Exists" and value:
            c.err(f"{path}.value", "must be empty when operator is Exists")
        out.append(Toleration(key=key, operator=op, value=value, effect=effect))
    return tuple(out)


def parse_policy_text(text: str) -> Policy:
    """Parse YAML text and compile it; YAML errors become a PolicyError with the line number. The size,
    nesting depth and alias expansion are checked first, on the event stream (policies/limits.py)."""
    if len(text) > MAX_POLICY_BYTES or len(text.encode()) > MAX_POLICY_BYTES:
        raise PolicyError([f"(document): larger than {MAX_POLICY_BYTES} bytes (the most one ConfigMap holds)"])
    try:
        check_yaml(text, "(document)")
    except LimitError as exc:
        raise PolicyError([f"line {exc.line}, column {exc.column}: {exc.problem}"]) from None
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark is not None else "(document)"
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise PolicyError([f"{where}: invalid YAML: {problem}"]) from None
    try:
        return compile_policy(doc, text)
    except PolicyError as exc:
        lines = _line_numbers(text)
        raise PolicyError([_with_line(e, lines) for e in exc.errors]) from None


def _line_numbers(text: str) -> dict[str, int]:
    """Field path (as errors spell it: `rules.x`, `pools[0].name`) -> 1-based line in the YAML text."""
    out: dict[str, int] = {}

    def walk(node: yaml.Node, prefix: str) -> None:
        if isinstance(node, yaml.MappingNode):
            for key, value in node.value:
                path = _join(prefix, str(key.value))
                out[path] = key.start_mark.line + 1
                walk(value, path)
        elif isinstance(node, yaml.SequenceNode):
            for i, item in enumerate(node.value):
                path = f"{prefix}[{i}]"
                out[path] = item.start_mark.line + 1
                walk(item, path)

    try:
        root = yaml.compose(text)
    except yaml.YAMLError:
        return out
    if root is not None:
        walk(root, "")
    return out


def _with_line(error: str, lines: dict[str, int]) -> str:
    path, sep, message = error.partition(": ")
    line = lines.get(path)
    return f"{path} (line {line}){sep}{message}" if line and sep else error


def default_policy_text() -> str:
    return importlib.resources.files("policies").joinpath("default-policy.yaml").read_text(encoding="utf-8")


_DEFAULT_RULES: dict[str, str] = {}


def _default_document_rules() -> dict[str, str]:
    """Actions of the built-in document, so an edit that leaves a rule out keeps its default action."""
    if not _DEFAULT_RULES:
        doc = yaml.safe_load(default_policy_text())
        _DEFAULT_RULES.update(doc.get("rules", {}))
    return _DEFAULT_RULES


def default_policy() -> Policy:
    return parse_policy_text(default_policy_text())
