"""User test suites (`gpu-admission test DIR`): cases of object in, expected verdict, warnings, mutations and
patch out, run through the same engine as `check` and the webhook.

A suite is a directory. Every `.yaml`/`.yml`/`.json` file under it holds one case per YAML document (the golden
cases' format, tests/cases/README.md, plus `expect.patch`); an optional `gpu-admission-test.yaml` at its root
sets what the cases share: the policy file, the nodes, and the directory relative paths start from. Reading is
bounded like `check`'s (webhook/manifests.py): a hostile file is one invalid case with a one-line reason, and
the other cases still run.
"""

from __future__ import annotations

import copy
import difflib
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import yaml

from cluster.pods import PodView
from policies import exceptions as exceptions_mod
from policies import inventory as inventory_mod
from policies.document import (
    MAX_POLICY_BYTES,
    MUTATION_IDS,
    RULE_IDS,
    Policy,
    PolicyError,
    compile_policy,
    default_policy_text,
)
from policies.engine import Review, ReviewContext, review
from policies.placement import Capacity, Reservation
from policies.subject import pod_facts
from webhook.cmd_check import cel_checker
from webhook.manifests import MANIFEST_SUFFIXES, Limits, ManifestError, load_objects, parse_documents
from webhook.state import capacity_of

SUITE_FILE = "gpu-admission-test.yaml"
SUITE_KEYS = ("base", "nodes", "pods", "policy")
CASE_KEYS = (
    "description",
    "nodes",
    "pods",
    "reservations",
    "policy",
    "namespaceLabels",
    "related",
    "exceptions",
    "now",
    "input",
    "expect",
    "xfail",
)
EXPECT_KEYS = (
    "allowed",
    "workload",
    "denials",
    "warnings",
    "warningsContain",
    "audited",
    "mutations",
    "object",
    "patch",
    "messageContains",
    "excepted",
    "reserves",
)
_STRING_LISTS = ("denials", "warnings", "warningsContain", "audited", "mutations", "messageContains", "excepted")
CASE_NOW = "2026-12-01T12:00:00Z"  # the clock of every case (`now` overrides it): exceptions expire against it

# Outcomes of one case. `invalid` is bad input (the case or what it names cannot be read): exit 2.
PASS, FAIL, XFAIL, XPASS, INVALID = "pass", "fail", "xfail", "xpass", "invalid"
KNOWN_IDS = frozenset(RULE_IDS) | frozenset(MUTATION_IDS)  # a warning "<id>: ..." is that rule's


class SuiteError(Exception):
    """The suite as a whole cannot be read (no such directory, a bad settings file): one line, exit 2."""


@dataclass(frozen=True)
class Case:
    id: str  # the file's path inside the suite, without suffix; `#n` for the n-th document of several
    doc: dict[str, Any]


@dataclass(frozen=True)
class Outcome:
    id: str
    status: str
    description: str = ""
    problems: tuple[str, ...] = ()  # what differs (may span lines: diffs), or why the case is invalid


@dataclass(frozen=True)
class Settings:
    base: Path  # relative `nodes`, `pods` and `policy` paths start here
    policy_file: str | None = None
    nodes: Any = "none"  # the cases' default: a file, "none" (empty inventory) or a list of Node objects
    pods: Any = None
    policy_doc: Mapping[str, Any] = field(default_factory=dict)  # the document case overrides merge onto


# --- reading ---------------------------------------------------------------------------------------------


def _did_you_mean(key: str, known: tuple[str, ...]) -> str:
    close = difflib.get_close_matches(key, known, n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _unknown(doc: Mapping[str, Any], known: tuple[str, ...], where: str) -> str | None:
    for key in doc:
        if key not in known:
            return f"{where}{key}: unknown key{_did_you_mean(str(key), known)}"
    return None


def _read_text(path: Path, limits: Limits) -> str:
    try:
        with path.open("rb") as f:
            data = f.read(limits.max_bytes + 1)
    except FileNotFoundError:
        raise ManifestError(f"{path}: no such file") from None
    except OSError as exc:
        raise ManifestError(f"{path}: {exc.strerror or exc}") from None
    if len(data) > limits.max_bytes:
        raise ManifestError(f"{path}: larger than the {limits.max_bytes}-byte limit (raise it with --max-input)")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise ManifestError(f"{path}: not UTF-8 text") from None


def load_settings(root: Path, limits: Limits) -> Settings:
    path = root / SUITE_FILE
    if not path.is_file():
        return Settings(base=root, policy_doc=_default_doc())
    try:
        docs = parse_documents(_read_text(path, limits), str(path), limits)
    except ManifestError as exc:
        raise SuiteError(str(exc)) from None
    raw = docs[0] if len(docs) == 1 else None
    if not isinstance(raw, dict):
        raise SuiteError(f"{path}: must be one mapping with keys {', '.join(SUITE_KEYS)}")
    bad = _unknown(raw, SUITE_KEYS, "")
    if bad:
        raise SuiteError(f"{path}: {bad}")
    base_raw = raw.get("base", ".")
    if not isinstance(base_raw, str):
        raise SuiteError(f"{path}: base: must be a directory path")
    base = (root / base_raw).resolve()
    if not base.is_dir():
        raise SuiteError(f"{path}: base: {base_raw!r} is not a directory")
    policy_raw = raw.get("policy")
    if policy_raw is not None and not isinstance(policy_raw, str):
        raise SuiteError(f"{path}: policy: must be the path of a policy document")
    policy_doc = _policy_file(base / policy_raw, limits) if policy_raw else _default_doc()
    for key in ("nodes", "pods"):
        message = _ref_problem(raw.get(key), key)
        if message:
            raise SuiteError(f"{path}: {message}")
    nodes, pods = raw.get("nodes", "none"), raw.get("pods")
    return Settings(base=base, policy_file=policy_raw, nodes=nodes, pods=pods, policy_doc=policy_doc)


def _default_doc() -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load(default_policy_text())
    return doc


def _policy_file(path: Path, limits: Limits) -> dict[str, Any]:
    """A full policy document, validated as the server would (every error named; the first is reported)."""
    try:
        text = _read_text(path, Limits(max_bytes=MAX_POLICY_BYTES, max_depth=limits.max_depth))
        docs = parse_documents(text, str(path), limits)
    except ManifestError as exc:
        raise SuiteError(f"policy {exc}") from None
    doc = docs[0] if len(docs) == 1 else None
    try:
        compile_policy(doc)
    except PolicyError as exc:
        more = f" (+{len(exc.errors) - 1} more)" if len(exc.errors) > 1 else ""
        raise SuiteError(f"policy {path}: {exc.errors[0]}{more}") from None
    assert isinstance(doc, dict)  # compile_policy accepted it
    return doc


def case_files(root: Path, settings: Settings | None = None) -> list[Path]:
    """Files that may hold cases: not the settings file, nor the files it names (policy, nodes, pods)."""
    named = {root / SUITE_FILE}
    if settings is not None:
        named |= {(settings.base / r).resolve() for r in (settings.policy_file, settings.nodes, settings.pods) if
                  isinstance(r, str)}  # fmt: skip
    files = (p for p in root.rglob("*") if p.suffix in MANIFEST_SUFFIXES and p.is_file())
    return sorted(p for p in files if p not in named and p.resolve() not in named)


def _is_data(docs: list[Any]) -> bool:
    """A file of Kubernetes objects (every document has apiVersion and kind: nodes, pods, related objects a
    case names) is data, not cases; a case never has those keys at its top."""
    return all(isinstance(d, dict) and "apiVersion" in d and "kind" in d for d in docs)


def load_cases(root: Path, settings: Settings, limits: Limits) -> tuple[list[Case], list[Outcome]]:
    """Every case under `root`, and an invalid outcome for each file or document that is not one."""
    if not root.is_dir():
        raise SuiteError(f"{root}: not a directory")
    cases: list[Case] = []
    invalid: list[Outcome] = []
    budget = limits.max_bytes
    for path in case_files(root, settings):
        name = path.relative_to(root).with_suffix("").as_posix()
        if budget <= 0:
            raise SuiteError(f"{root}: more than {limits.max_bytes} bytes of cases (raise it with --max-input)")
        try:
            text = _read_text(path, Limits(budget, limits.max_objects, limits.max_depth))
            docs = parse_documents(text, path.relative_to(root).as_posix(), limits)
        except ManifestError as exc:
            invalid.append(Outcome(name, INVALID, problems=(str(exc),)))
            continue
        budget -= len(text.encode())
        if docs and _is_data(docs):
            continue
        if not docs:
            invalid.append(Outcome(name, INVALID, problems=(f"{name}: no case in the file",)))
        for i, doc in enumerate(docs, start=1):
            case_id = name if len(docs) == 1 else f"{name}#{i}"
            problem = case_problem(doc)
            if problem:
                invalid.append(Outcome(case_id, INVALID, problems=(f"{case_id}: {problem}",)))
            else:
                cases.append(Case(case_id, doc))
        if len(cases) + len(invalid) > limits.max_objects:
            raise SuiteError(f"{root}: more than {limits.max_objects} cases (raise it with --max-objects)")
    return cases, invalid


def _ref_problem(value: Any, key: str) -> str | None:
    if value is None or isinstance(value, str):
        return None
    if isinstance(value, list) and all(isinstance(o, dict) for o in value):
        return None
    return f"{key}: must be a file path or a list of objects"


def case_problem(doc: Any) -> str | None:
    """Why a document is not a case (the field path and what is wrong), or None."""
    if not isinstance(doc, dict):
        return "a case is a mapping with description, input and expect"
    checks: list[str | None] = [_unknown(doc, CASE_KEYS, "")]
    if not isinstance(doc.get("description"), str) or not doc["description"].strip():
        checks.append("description: required, one line saying what the case proves")
    if "input" not in doc:
        checks.append("input: required, the object to review")
    checks += [_ref_problem(doc.get("nodes"), "nodes"), _ref_problem(doc.get("pods"), "pods")]
    checks.append(_reservations_problem(doc.get("reservations")))
    for key, kind in (("policy", dict), ("namespaceLabels", dict), ("related", list), ("exceptions", list)):
        if key in doc and not isinstance(doc[key], kind):
            checks.append(f"{key}: must be a {'mapping' if kind is dict else 'list'}")
    if "now" in doc and _when(doc["now"]) is None:
        checks.append("now: must be a time such as 2026-12-01T12:00:00Z")
    if "xfail" in doc and not isinstance(doc["xfail"], str):
        checks.append("xfail: must be the reason, a string")
    checks.append(_expect_problem(doc.get("expect")))
    return next((c for c in checks if c), None)


def _reservations_problem(value: Any) -> str | None:
    if value is None:
        return None
    for i, r in enumerate(value if isinstance(value, list) else [None]):
        ok = isinstance(r, dict) and all(isinstance(r.get(k), str) for k in ("job", "key", "domain"))
        sizes = r.get("sizes") if isinstance(r, dict) else None
        if not ok or not isinstance(sizes, list) or not all(type(n) is int and n > 0 for n in sizes):
            return f"reservations[{i}]: must be {{job, key, domain, sizes: [GPUs per pod, ...]}}"
    return None


def reservations_for(items: list[Any]) -> tuple[Reservation, ...]:
    """The server's open reservations: {job, key, domain, sizes} each (job as placement.job_id spells it)."""
    return tuple(Reservation(r["job"], r["key"], r["domain"], tuple(r["sizes"])) for r in items)


def _expect_problem(expect: Any) -> str | None:
    if not isinstance(expect, dict):
        return "expect: required, a mapping with at least allowed: true|false"
    bad = _unknown(expect, EXPECT_KEYS, "expect.")
    if bad:
        return bad
    if not isinstance(expect.get("allowed"), bool):
        return "expect.allowed: required, true or false"
    for key in _STRING_LISTS:
        value = expect.get(key)
        if value is not None and not (isinstance(value, list) and all(isinstance(v, str) for v in value)):
            return f"expect.{key}: must be a list of strings"
    if "workload" in expect and expect["workload"] not in (None, "training", "inference", "batch"):
        return "expect.workload: must be training, inference, batch or null"
    patch = expect.get("patch")
    if patch is not None and not (isinstance(patch, list) and all(isinstance(op, dict) for op in patch)):
        return "expect.patch: must be a list of RFC 6902 operations"
    reserves = expect.get("reserves")
    if reserves is not None and not (isinstance(reserves, dict) and set(reserves) <= {"domain", "sizes"}):
        return "expect.reserves: must be null or a mapping of domain and sizes"
    return None


# --- what a case decides with ---------------------------------------------------------------------------


def _when(value: Any) -> float | None:
    try:
        return datetime.fromisoformat(str(value).replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def exceptions_for(case: Mapping[str, Any], obj: Any) -> tuple[tuple[exceptions_mod.Exemption, ...], float]:
    """The case's GPUPolicyExceptions of the object's namespace, as the server's index hands them over, and
    the time to judge them by. ExceptionError names the bad field of an exception the API server would refuse."""
    now = _when(case.get("now", CASE_NOW))
    meta = obj.get("metadata") if isinstance(obj, dict) else None
    ns = (meta.get("namespace") if isinstance(meta, dict) else None) or "default"
    parsed = [exceptions_mod.parse(e) for e in case.get("exceptions") or []]
    return exceptions_mod.index(parsed).get(ns, ()), now if now is not None else 0.0


def deep_merge(base: Any, override: Any) -> Any:
    """Mappings merge key by key; anything else (lists, scalars) in the override replaces the base."""
    if isinstance(base, Mapping) and isinstance(override, Mapping):
        out = dict(base)
        for key, value in override.items():
            out[key] = deep_merge(base[key], value) if key in base else value
        return out
    return override


def resolver(related: list[Any]) -> Callable[[str, str, str], dict[str, Any] | None]:
    """Targets of HPAs / ScaledObjects, looked up like `check` does in its input set."""
    index: dict[tuple[str, str, str], dict[str, Any]] = {}
    for obj in related:
        meta = obj.get("metadata") if isinstance(obj, dict) else None
        meta = meta if isinstance(meta, dict) else {}
        index[(str(obj.get("kind")), str(meta.get("namespace") or "default"), str(meta.get("name")))] = obj

    def resolve(kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        found = index.get((kind, namespace or "default", name))
        return copy.deepcopy(found) if found is not None else None

    return resolve


class Builder:
    """Policies, node lists and pod views of a suite's cases, each read once."""

    def __init__(self, settings: Settings, limits: Limits) -> None:
        self.settings = settings
        self.limits = limits
        self._files: dict[str, list[dict[str, Any]]] = {}
        self._policies: dict[str, Policy] = {}
        self.cel_check = cel_checker()  # DRA CEL selectors judged as `check` judges them

    def objects(self, ref: str) -> list[dict[str, Any]]:
        """The objects of a file named relative to the suite's base (read once, bounded like `check -f`)."""
        if ref not in self._files:
            path = self.settings.base / ref
            if not path.is_file():
                raise ManifestError(f"{ref}: no such file (relative to {self.settings.base})")
            self._files[ref] = load_objects([str(path)], self.limits)
        return self._files[ref]

    def policy(self, overrides: Any) -> Policy:
        key = json.dumps(overrides, sort_keys=True, default=str)
        if key not in self._policies:
            doc = deep_merge(copy.deepcopy(dict(self.settings.policy_doc)), overrides or {})
            self._policies[key] = compile_policy(doc)
        return self._policies[key]

    def inventory(self, nodes: Any, policy: Policy) -> inventory_mod.Inventory:
        if nodes == "none" or nodes is None:
            objects: list[Any] = []
        elif isinstance(nodes, list):
            objects = nodes
        else:
            objects = list(self.objects(str(nodes)))
        # Nodes plus the ResourceSlices and DeviceClasses beside them, as `check --nodes` reads a cluster.
        return inventory_mod.build_cluster(copy.deepcopy(objects), policy)

    def capacity(self, pods: Any) -> Capacity | None:
        """The pod view of `pods` (a list of Pods or a file of them); None without the key (placement by
        allocatable only, as `check` without --pods)."""
        if pods is None:
            return None
        objects = self.objects(pods) if isinstance(pods, str) else pods
        view = PodView(pod_facts)
        view.load({str(i): copy.deepcopy(p) for i, p in enumerate(objects) if p.get("kind", "Pod") == "Pod"})
        return capacity_of(view.snapshot())

    def run(self, case: Mapping[str, Any], obj: Any) -> tuple[Review, Policy, inventory_mod.Inventory, ReviewContext]:
        """Review `obj` as the case says (its policy, nodes, pod view, namespace labels, related objects)."""
        policy = self.policy(case.get("policy"))
        inv = self.inventory(case.get("nodes", self.settings.nodes), policy)
        excs, now = exceptions_for(case, obj)
        ctx = ReviewContext(
            namespace_labels=case.get("namespaceLabels"),
            resolve=resolver(case.get("related") or []),
            capacity=self.capacity(case.get("pods", self.settings.pods)),
            exceptions=excs,
            now=now,
            cel_check=self.cel_check,
            reservations=reservations_for(case.get("reservations") or []),
        )
        return review(obj, policy=policy, inventory=inv, ctx=ctx), policy, inv, ctx


# --- comparing ------------------------------------------------------------------------------------------


def warning_rule(warning: str) -> str | None:
    head, sep, _ = warning.partition(": ")
    return head if sep and head in KNOWN_IDS else None


def _dump(value: Any) -> list[str]:
    return yaml.safe_dump(value, sort_keys=True, default_flow_style=False, allow_unicode=True).splitlines()


def _diff(what: str, expected: Any, got: Any) -> str:
    lines = difflib.unified_diff(_dump(expected), _dump(got), "expected", "got", lineterm="", n=2)
    return f"{what} differs:\n" + "\n".join(f"  {line}" for line in lines)


def _sets(what: str, expected: list[str] | None, got: set[str]) -> str | None:
    want = set(expected or [])
    if want == got:
        return None
    missing, extra = sorted(want - got), sorted(got - want)
    parts = [f"missing {missing}" if missing else "", f"unexpected {extra}" if extra else ""]
    return f"{what}: expected {sorted(want)}, got {sorted(got)} ({', '.join(p for p in parts if p)})"


def compare(expect: Mapping[str, Any], r: Review) -> list[str]:
    """Every way the review differs from what the case expects; empty when it matches."""
    problems: list[str] = []
    if r.allowed is not expect["allowed"]:
        verdict = "allowed" if r.allowed else f"denied: {r.denial_message()}"
        problems.append(f"allowed: expected {expect['allowed']}, got {r.allowed} ({verdict})")
    if "workload" in expect and r.workload != expect["workload"]:
        problems.append(f"workload: expected {expect['workload']}, got {r.workload}")
    denied = {d.rule for d in r.denials}
    warned = {w for w in (warning_rule(w) for w in r.warnings) if w}
    audited = {res.rule for res in r.results if res.outcome == "audit"}
    mutated = set(r.mutations)
    excepted = {res.rule for res in r.results if res.outcome == "excepted"}
    for what, got in (
        ("denials", denied),
        ("warnings", warned),
        ("audited", audited),
        ("mutations", mutated),
        ("excepted", excepted),
    ):
        problems.append(_sets(what, expect.get(what), got) or "")
    wanted = list(expect.get("warningsContain") or [])
    for w in r.warnings:
        if warning_rule(w) is None and not any(s in w for s in wanted):
            problems.append(f"warnings: unexpected {w!r} (list a substring in warningsContain)")
    problems += [f"warningsContain: no warning contains {s!r}" for s in wanted if not any(s in w for w in r.warnings)]
    message = r.denial_message()
    problems += [
        f"messageContains: the denial message lacks {s!r}; it is {message!r}"
        for s in expect.get("messageContains") or []
        if s not in message
    ]
    if "object" in expect and r.object != expect["object"]:
        problems.append(_diff("object", expect["object"], r.object))
    if "patch" in expect and list(r.patch) != expect["patch"]:
        problems.append(_diff("patch", expect["patch"], list(r.patch)))
    if "reserves" in expect:
        problems.append(_reserves(expect["reserves"], r))
    return [p for p in problems if p]


def _reserves(want: Mapping[str, Any] | None, r: Review) -> str:
    """What the server would reserve after this review (Review.placement): null = nothing."""
    got = {"domain": r.placement.domain, "sizes": list(r.placement.sizes)} if r.placement is not None else None
    if want is None or got is None:
        return "" if want == got else f"reserves: expected {want}, got {got}"
    wrong = {k: got[k] for k in want if want[k] != got[k]}
    return f"reserves: expected {dict(want)}, got {got}" if wrong else ""


def run_case(builder: Builder, case: Case) -> Outcome:
    doc = case.doc
    description = str(doc["description"]).strip()
    try:
        r, *_ = builder.run(doc, copy.deepcopy(doc["input"]))
    except PolicyError as exc:
        more = f" (+{len(exc.errors) - 1} more)" if len(exc.errors) > 1 else ""
        return Outcome(case.id, INVALID, description, (f"{case.id}: policy.{exc.errors[0]}{more}",))
    except ManifestError as exc:
        return Outcome(case.id, INVALID, description, (f"{case.id}: {exc}",))
    except exceptions_mod.ExceptionError as exc:
        return Outcome(case.id, INVALID, description, (f"{case.id}: exceptions: {exc.errors[0]}",))
    except Exception as exc:  # inline nodes or pods the inventory cannot read: the case's input, not a crash
        return Outcome(case.id, INVALID, description, (f"{case.id}: cannot build the cluster ({type(exc).__name__})",))
    problems = tuple(compare(doc["expect"], r))
    if "xfail" in doc:
        return Outcome(case.id, XFAIL if problems else XPASS, description, problems or (f"xfail: {doc['xfail']}",))
    return Outcome(case.id, FAIL if problems else PASS, description, problems)


def run_suite(root: Path, limits: Limits) -> list[Outcome]:
    """Every case of the suite at `root`, in path order; invalid files first."""
    settings = load_settings(root, limits)
    cases, invalid = load_cases(root, settings, limits)
    builder = Builder(settings, limits)
    return invalid + [run_case(builder, c) for c in cases]


def exit_code(outcomes: list[Outcome]) -> int:
    """2 when any case could not be read (the suite is broken), else 1 when any failed, else 0."""
    statuses = {o.status for o in outcomes}
    if INVALID in statuses or not outcomes:
        return 2
    return 1 if statuses & {FAIL, XPASS} else 0
