"""GPUPolicyExceptions and the namespace enforcement label, below the real control plane: parsing with field
paths (the same checks as the CRD schema), the CRD kept equal to the rule registry, the per-namespace index,
the webhook's answers and metrics, and `check` taking exceptions from its inputs. The golden cases
(tests/cases/exceptions/) are the engine's spec; tests/e2e/test_exceptions_e2e.py runs it all for real."""

from __future__ import annotations

import asyncio
import copy
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import orjson
import pytest
import yaml

from cluster.namespaced import NamespacedIndex
from cluster.reflector import Change
from policies import exceptions as ex
from policies.document import RULE_IDS
from policies.protect import enforcement_change
from webhook.app import ServerConfig, create_app
from webhook.manifests import load_objects
from webhook.metrics import Metrics
from webhook.state import State

ROOT = Path(__file__).resolve().parent.parent
CRD = ROOT / "deploy" / "base" / "exceptions-crd.yaml"


def stamp(delta: timedelta) -> str:
    return (datetime.now(UTC) + delta).strftime("%Y-%m-%dT%H:%M:%SZ")


def exception(name: str = "dpo-trial", ns: str = "ml", **spec: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "rules": ["training-elastic-shrink"],
        "workloads": {"names": ["dpo"]},
        "reason": "trial, INC-1",
        "requester": "alice",
        "approver": "bob",
        "until": stamp(timedelta(days=7)),
    }
    body.update(spec)
    return {
        "apiVersion": ex.API_VERSION,
        "kind": ex.KIND,
        "metadata": {"name": name, "namespace": ns},
        "spec": body,
    }


# -- parsing: every bad field named by its path -----------------------------------------------------------


def test_a_valid_exception_parses() -> None:
    e = ex.parse(exception())
    assert (e.ref, e.rules, e.names, e.selector) == ("ml/dpo-trial", {"training-elastic-shrink"}, {"dpo"}, None)


HOSTILE = [
    ({"rules": []}, "spec.rules: Required value"),
    ({"rules": ["training-pool"]}, "spec.rules[0]: Unsupported value: 'training-pool'"),
    ({"workloads": {}}, "spec.workloads: Invalid value: must name workloads or give a selector"),
    ({"workloads": {"names": ["Bad_Name"]}}, "spec.workloads.names[0]: Invalid value: 'Bad_Name'"),
    ({"workloads": {"selector": {}}}, "spec.workloads.selector: Invalid value: an empty selector"),
    (
        {"workloads": {"selector": {"matchLabels": {"bad key!": "x"}}}},
        "spec.workloads.selector.matchLabels[bad key!]: Invalid value: 'bad key!': must be a label key",
    ),
    (
        {"workloads": {"selector": {"matchLabels": {"team": "a b"}}}},
        "spec.workloads.selector.matchLabels[team]: Invalid value: 'a b'",
    ),
    (
        {"workloads": {"selector": {"matchExpressions": [{"key": "team", "operator": "Like", "values": ["a"]}]}}},
        "spec.workloads.selector.matchExpressions[0].operator: Unsupported value: 'Like'",
    ),
    (
        {"workloads": {"selector": {"matchExpressions": [{"key": "team", "operator": "In"}]}}},
        "spec.workloads.selector.matchExpressions[0].values: Required value",
    ),
    (
        {"workloads": {"selector": {"matchExpressions": [{"key": "team", "operator": "Exists", "values": ["a"]}]}}},
        "spec.workloads.selector.matchExpressions[0].values: Forbidden",
    ),
    ({"until": "next tuesday"}, "spec.until: Invalid value: 'next tuesday': must be an RFC 3339 date-time"),
    ({"until": "2027-01-01T00:00:00"}, "with a time zone"),
    ({"until": "2027-01-01"}, "with a time zone"),
    ({"reason": ""}, "spec.reason: Required value"),
    ({"reason": "x" * 1025}, "spec.reason: Too long"),
    ({"approver": "alice"}, "spec.approver: Invalid value: 'alice': must differ from spec.requester"),
]


@pytest.mark.parametrize(("spec", "error"), HOSTILE, ids=[e for _, e in HOSTILE])
def test_a_bad_field_is_named_by_its_path(spec: dict[str, Any], error: str) -> None:
    with pytest.raises(ex.ExceptionError) as info:
        ex.parse(exception(**spec))
    assert any(error in line for line in info.value.errors), info.value.errors
    assert all("\n" not in line for line in info.value.errors)


@pytest.mark.parametrize("obj", [None, [], "x", {"spec": None}, {"metadata": [], "spec": {}}, {"spec": {"rules": 1}}])
def test_garbage_is_an_exception_error_never_a_crash(obj: Any) -> None:
    with pytest.raises(ex.ExceptionError):
        ex.parse(obj)


def test_until_must_lie_ahead_and_within_the_limit() -> None:
    now = time.time()
    assert ex.check_until(ex.parse(exception()), now) == []
    past = ex.parse(exception(until=stamp(-timedelta(seconds=5))))
    assert ex.check_until(past, now)[0].endswith("must be in the future")
    assert ex.check_until(past, now)[0].startswith("spec.until: Invalid value:")
    far = ex.parse(exception(until=stamp(timedelta(days=ex.MAX_DAYS, hours=1))))
    assert "at most 366 days" in ex.check_until(far, now)[0]
    edge = ex.parse(exception(until=stamp(timedelta(days=ex.MAX_DAYS, minutes=-1))))
    assert ex.check_until(edge, now) == []


def test_expiry_is_at_until_exactly() -> None:
    e = ex.parse(exception(until="2026-12-24T00:00:00Z"))
    assert not e.expired(e.until - 0.001) and e.expired(e.until)


# -- the CRD says what parse says -------------------------------------------------------------------------


def _crd_spec() -> dict[str, Any]:
    crd = yaml.safe_load(CRD.read_text())
    schema: dict[str, Any] = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    return schema


def test_crd_rule_enum_is_the_rule_registry() -> None:
    rules = _crd_spec()["properties"]["rules"]
    assert rules["items"]["enum"] == list(RULE_IDS)
    assert rules["maxItems"] == ex.MAX_RULES


def test_crd_bounds_are_the_parsers() -> None:
    spec = _crd_spec()["properties"]
    selector = spec["workloads"]["properties"]["selector"]["properties"]
    assert spec["workloads"]["properties"]["names"]["maxItems"] == ex.MAX_NAMES
    assert selector["matchLabels"]["maxProperties"] == ex.MAX_LABELS
    assert selector["matchExpressions"]["maxItems"] == ex.MAX_EXPRESSIONS
    expr = selector["matchExpressions"]["items"]["properties"]
    assert expr["operator"]["enum"] == list(ex.OPERATORS)
    assert expr["values"]["maxItems"] == ex.MAX_VALUES
    assert spec["reason"]["maxLength"] == ex.MAX_TEXT
    assert spec["requester"]["maxLength"] == spec["approver"]["maxLength"] == ex.MAX_WHO
    assert set(_crd_spec()["required"]) == {"rules", "workloads", "reason", "requester", "approver", "until"}


# -- the per-namespace index ------------------------------------------------------------------------------


def test_the_index_keeps_each_namespace_apart_and_names_what_it_skips() -> None:
    index: NamespacedIndex[ex.Exemption] = NamespacedIndex(ex.parse)
    a, b = exception("a", "ml"), exception("b", "vision")
    bad = exception("c", "ml", rules=["nope"])
    for obj in (a, b, bad):
        index.apply(Change("ADDED", f"{obj['metadata']['namespace']}/{obj['metadata']['name']}", None, obj))
    snap = index.snapshot()
    assert [e.ref for e in snap.get("ml")] == ["ml/a"] and [e.ref for e in snap.get("vision")] == ["vision/b"]
    assert list(snap.skipped) == ["ml/c"] and "spec.rules[0]" in snap.skipped["ml/c"]
    assert not snap.synced
    index.apply(Change("DELETED", "ml/a", a, None))
    index.apply(Change("MODIFIED", "ml/c", bad, exception("c", "ml")))
    index.apply(Change("SYNCED", "", None, None))
    after = index.snapshot()
    assert [e.ref for e in after.get("ml")] == ["ml/c"] and not after.skipped and after.synced
    assert [e.ref for e in snap.get("ml")] == ["ml/a"], "a published snapshot never changes"


# -- the namespace enforcement label ----------------------------------------------------------------------


def ns(label: str | None) -> dict[str, Any]:
    labels = {"team": "ml"} if label is None else {"team": "ml", "gpu-admission.io/enforcement": label}
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "ml", "labels": labels}}


@pytest.mark.parametrize(
    ("old", "new", "groups", "denied"),
    [
        (None, "off", ["system:authenticated"], True),  # set on an existing namespace
        ("enforce", "warn", ["system:authenticated", "ml-team"], True),
        ("warn", None, ["system:authenticated"], True),  # removed: back to the policy default
        (None, None, ["system:authenticated"], False),  # other labels change: not ours to judge
        ("off", "off", ["system:authenticated"], False),
        (None, "off", ["gpu-admission:exception-approvers"], False),
        (None, "off", ["system:masters"], False),
        (None, "off", ["system:serviceaccounts:kube-system"], False),
    ],
)
def test_only_trusted_groups_change_the_enforcement_label(
    old: str | None, new: str | None, groups: list[str], denied: bool
) -> None:
    message = enforcement_change(ns(new), ns(old), groups)
    assert (message is not None) is denied, message
    if message:
        assert "gpu-admission:exception-approvers" in message and "Fix: " in message and "\n" not in message


def test_create_with_the_label_is_a_change_and_a_bad_value_is_refused_even_when_trusted() -> None:
    assert enforcement_change(ns("off"), None, ["system:authenticated"]) is not None
    assert enforcement_change(ns(None), None, ["system:authenticated"]) is None
    bad = enforcement_change(ns("of"), None, ["system:masters"])
    assert bad is not None and bad.startswith("metadata.labels[gpu-admission.io/enforcement]: Unsupported value")


def test_the_configured_group_replaces_the_default() -> None:
    assert enforcement_change(ns("off"), ns(None), ["sre"], trusted=("sre",)) is None
    assert enforcement_change(ns("off"), ns(None), ["gpu-admission:exception-approvers"], trusted=("sre",))


# -- the webhook ------------------------------------------------------------------------------------------


def admission(obj: Any, *, operation: str = "CREATE", old: Any = None, groups: list[str] | None = None) -> bytes:
    meta = obj.get("metadata", {})
    return orjson.dumps(
        {
            "apiVersion": "admission.k8s.io/v1",
            "kind": "AdmissionReview",
            "request": {
                "uid": "u1",
                "kind": {"kind": obj.get("kind")},
                "operation": operation,
                "namespace": meta.get("namespace", ""),
                "name": meta.get("name", ""),
                "userInfo": {"username": "mallory", "groups": groups or ["system:authenticated"]},
                "object": obj,
                "oldObject": old,
            },
        }
    )


ELASTIC_JOB = {
    "apiVersion": "kubeflow.org/v1",
    "kind": "PyTorchJob",
    "metadata": {"name": "dpo", "namespace": "ml", "labels": {"kueue.x-k8s.io/queue-name": "q"}},
    "spec": {
        "elasticPolicy": {"minReplicas": 1, "maxReplicas": 4},
        "pytorchReplicaSpecs": {
            "Worker": {
                "replicas": 2,
                "template": {"spec": {"containers": [{"name": "t", "resources": {"limits": {"nvidia.com/gpu": 4}}}]}},
            }
        },
    },
}


class Server:
    def __init__(self) -> None:
        self.state = State()
        self.state.set_nodes(load_objects([str(ROOT / "examples" / "cluster" / "nodes.yaml")]), "file")
        self.metrics = Metrics()
        self.audit: list[dict[str, Any]] = []
        recorder = type("Audit", (), {"record": lambda _, r: self.audit.append(r), "stats": lambda _: {}})()
        app = create_app(self.state, metrics=self.metrics, audit=recorder, config=ServerConfig())
        self.handler = app.state.review_bytes

    def add(self, obj: dict[str, Any]) -> None:
        key = f"{obj['metadata']['namespace']}/{obj['metadata']['name']}"
        self.state.exceptions.apply(Change("ADDED", key, None, obj))

    def post(self, body: bytes, webhook: str = "validate") -> dict[str, Any]:
        status, payload = asyncio.run(self.handler(body, webhook, None))
        assert status == 200, payload
        response: dict[str, Any] = orjson.loads(payload)["response"]
        return response


def test_the_webhook_applies_an_exception_and_reports_it_in_answer_audit_and_metrics() -> None:
    s = Server()
    assert s.post(admission(ELASTIC_JOB), "admit")["allowed"] is False
    s.add(exception())
    r = s.post(admission(ELASTIC_JOB), "admit")
    assert r["allowed"] is True
    assert any("training-elastic-shrink excepted by ml/dpo-trial" in w for w in r["warnings"])
    assert r["auditAnnotations"]["exceptions"] == "ml/dpo-trial"
    assert "training-elastic-shrink=excepted" in r["auditAnnotations"]["rules"]
    record = s.audit[-1]
    assert record["exceptions"] == ["ml/dpo-trial"]
    assert {"rule": "training-elastic-shrink", "outcome": "excepted"}.items() <= next(
        x for x in record["rules"] if x["rule"] == "training-elastic-shrink"
    ).items()
    text = s.metrics.render()
    assert 'gpu_admission_exceptions_applied_total{exception="ml/dpo-trial",rule="training-elastic-shrink"} 1' in text
    assert 'gpu_admission_rule_results_total{rule="training-elastic-shrink",outcome="excepted"} 1' in text
    assert 'gpu_admission_exceptions{state="active"} 1' in text


def test_an_expired_exception_is_ignored_counted_and_logged_once(caplog: pytest.LogCaptureFixture) -> None:
    s = Server()
    s.add(exception(until=stamp(-timedelta(minutes=1))))
    for _ in range(3):
        r = s.post(admission(ELASTIC_JOB), "admit")
        assert r["allowed"] is False
        assert any("training-elastic-shrink applies again: exception ml/dpo-trial expired" in w for w in r["warnings"])
    text = s.metrics.render()
    assert 'gpu_admission_exceptions{state="expired"} 1' in text
    assert 'gpu_admission_exceptions{state="active"} 0' in text
    logged = [r for r in caplog.records if r.getMessage() == "exception expired: ignored"]
    assert len(logged) == 1 and s.state.expired_reported == 1
    assert s.audit[-1]["expiredExceptions"] == ["ml/dpo-trial"]


def test_the_webhook_refuses_an_exception_ending_in_the_past_with_its_field_path() -> None:
    s = Server()
    r = s.post(admission(exception(until=stamp(-timedelta(hours=1)))))
    assert r["allowed"] is False and r["status"]["code"] == 422
    assert r["status"]["message"].startswith("GPUPolicyException ml/dpo-trial is invalid: spec.until: Invalid value:")
    assert s.post(admission(exception()))["allowed"] is True
    bad = s.post(admission(exception(rules=["nope"])))
    assert "spec.rules[0]: Unsupported value" in bad["status"]["message"]


def test_the_webhook_guards_the_enforcement_label() -> None:
    s = Server()
    r = s.post(admission(ns("off"), operation="UPDATE", old=ns(None)))
    assert r["allowed"] is False and r["status"]["code"] == 403
    assert r["status"]["message"].startswith("changing namespace label gpu-admission.io/enforcement (unset to 'off')")
    assert s.audit[-1]["rules"][0]["outcome"] == "deny" and s.audit[-1]["user"] == "mallory"
    trusted = ["gpu-admission:exception-approvers"]
    assert s.post(admission(ns("off"), operation="UPDATE", old=ns(None), groups=trusted))["allowed"] is True


# -- check ------------------------------------------------------------------------------------------------


def run_check(tmp_path: Path, *docs: dict[str, Any]) -> subprocess.CompletedProcess[str]:
    path = tmp_path / "in.yaml"
    path.write_text(yaml.safe_dump_all(docs))
    return subprocess.run(
        [sys.executable, "-m", "webhook", "check", "-f", str(path), "--nodes", "examples/cluster/nodes.yaml"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
    )


def test_check_takes_exceptions_from_its_inputs(tmp_path: Path) -> None:
    denied = run_check(tmp_path, ELASTIC_JOB)
    assert denied.returncode == 1 and "deny     training-elastic-shrink" in denied.stdout
    allowed = run_check(tmp_path, ELASTIC_JOB, exception())
    assert allowed.returncode == 0, allowed.stdout + allowed.stderr
    assert "warning  training-elastic-shrink excepted by ml/dpo-trial until" in allowed.stdout


def test_check_ignores_an_expired_exception_and_says_so(tmp_path: Path) -> None:
    r = run_check(tmp_path, ELASTIC_JOB, exception(until="2020-01-01T00:00:00Z"))
    assert r.returncode == 1
    assert "gpu-admission: warning: exception ml/dpo-trial expired 2020-01-01T00:00:00Z: ignored" in r.stderr


def test_check_refuses_a_malformed_exception_in_one_line(tmp_path: Path) -> None:
    hostile = copy.deepcopy(exception())
    hostile["spec"]["workloads"] = {"selector": {"matchExpressions": [{"key": "a", "operator": "In"}]}}
    r = run_check(tmp_path, ELASTIC_JOB, hostile)
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr.count("\n") == 1 and "Traceback" not in r.stderr
    assert "GPUPolicyException ml/dpo-trial is invalid: spec.workloads.selector.matchExpressions[0].values" in r.stderr


def test_the_example_exception_is_valid() -> None:
    (obj,) = load_objects([str(ROOT / "examples" / "exceptions" / "dpo-elastic-trial.yaml")])
    e = ex.parse(obj)
    assert (e.ref, e.rules, e.names) == (
        "ml-research/dpo-elastic-trial",
        {"training-elastic-shrink"},
        {"mistral-7b-dpo"},
    )


MORE_HOSTILE = [
    ({"workloads": {"names": "dpo"}}, "spec.workloads.names: Invalid value: must be a list of names"),
    ({"workloads": {"names": ["a"] * 65}}, "spec.workloads.names: Too many: 65: must have at most 64 items"),
    ({"workloads": {"names": ["a" * 254]}}, "spec.workloads.names[0]: Invalid value"),
    ({"workloads": "dpo"}, "spec.workloads: Required value: names and/or selector"),
    ({"workloads": {"selector": "team=a"}}, "spec.workloads.selector: Invalid value: must be a label selector"),
    ({"workloads": {"selector": {"matchLabels": ["a"]}}}, "spec.workloads.selector.matchLabels: Invalid value"),
    ({"workloads": {"selector": {"matchLabels": {f"k{i}": "v" for i in range(33)}}}},
     "spec.workloads.selector.matchLabels: Too many: 33: must have at most 32 items"),
    ({"workloads": {"selector": {"matchLabels": {"team": "x" * 64}}}}, "spec.workloads.selector.matchLabels[team]"),
    ({"workloads": {"selector": {"matchLabels": {"a/" + "b" * 64: "x"}}}}, "must be a label key"),
    ({"workloads": {"selector": {"matchExpressions": {"key": "a"}}}},
     "spec.workloads.selector.matchExpressions: Invalid value: must be a list"),
    ({"workloads": {"selector": {"matchExpressions": [{"key": "a", "operator": "Exists"}] * 17}}},
     "spec.workloads.selector.matchExpressions: Too many: 17: must have at most 16 items"),
    ({"workloads": {"selector": {"matchExpressions": ["a"]}}},
     "spec.workloads.selector.matchExpressions[0]: Invalid value: must be a requirement"),
    ({"workloads": {"selector": {"matchExpressions": [{"key": "bad key", "operator": "Exists"}]}}},
     "spec.workloads.selector.matchExpressions[0].key: Invalid value: 'bad key': must be a label key"),
    ({"workloads": {"selector": {"matchExpressions": [{"key": "a", "operator": "In", "values": "x"}]}}},
     "spec.workloads.selector.matchExpressions[0].values: Invalid value: must be a list of at most 64 label values"),
    ({"workloads": {"selector": {"matchExpressions": [{"key": "a", "operator": "In", "values": ["x"] * 65}]}}},
     "must be a list of at most 64 label values"),
    ({"workloads": {"selector": {"matchExpressions": [{"key": "a", "operator": "NotIn", "values": []}]}}},
     "spec.workloads.selector.matchExpressions[0].values: Required value: must be specified when operator is NotIn"),
    ({"workloads": {"selector": {"matchExpressions": [{"key": "a", "operator": "DoesNotExist", "values": ["x"]}]}}},
     "Forbidden: may not be specified when operator is DoesNotExist"),
    ({"workloads": {"selector": {"matchExpressions": [{"key": "a", "operator": "In", "values": ["a b"]}]}}},
     "spec.workloads.selector.matchExpressions[0].values[0]: Invalid value: 'a b': must be a label value"),
    ({"rules": ["training-same-rack"] * 12}, "spec.rules: Too many: 12: must have at most 11 items"),  # 11 rules
    ({"rules": "training-same-rack"}, "spec.rules: Required value: name at least one rule id"),
    ({"until": ""}, "spec.until: Required value: an RFC 3339 date-time"),
    ({"until": 5}, "spec.until: Required value"),
    ({"requester": " "}, "spec.requester: Required value"),
    ({"approver": "x" * 254}, "spec.approver: Too long: may not be more than 253 characters"),
]  # fmt: skip


@pytest.mark.parametrize(("spec", "error"), MORE_HOSTILE, ids=[e for _, e in MORE_HOSTILE])
def test_every_bound_and_shape_is_named(spec: dict[str, Any], error: str) -> None:
    with pytest.raises(ex.ExceptionError) as info:
        ex.parse(exception(**spec))
    assert any(error in line for line in info.value.errors), info.value.errors
    assert str(info.value) == "; ".join(info.value.errors)


def test_no_name_and_no_spec_are_both_reported() -> None:
    with pytest.raises(ex.ExceptionError) as info:
        ex.parse({"metadata": {}})
    assert info.value.errors == ["metadata.name: Required value", "spec: Required value"]


@pytest.mark.parametrize(
    ("until", "epoch"),
    [("2026-12-24T00:00:00Z", 1798070400.0), ("2026-12-24T00:00:00z", 1798070400.0),
     ("2026-12-24T02:00:00+02:00", 1798070400.0), ("2026-12-24T00:00:00.5Z", 1798070400.5)],
)  # fmt: skip
def test_until_in_any_rfc3339_form(until: str, epoch: float) -> None:
    e = ex.parse(exception(until=until))
    assert (e.until, e.until_text) == (epoch, until)


def test_a_selector_matches_labels_and_expressions_together() -> None:
    sel = ex.Selector((("team", "a"),), ({"key": "tier", "operator": "In", "values": ["gold"]},))
    assert sel.matches({"team": "a", "tier": "gold"})
    assert not sel.matches({"team": "a", "tier": "silver"})
    assert not sel.matches({"team": "b", "tier": "gold"})
    parsed = ex.parse(exception(workloads={"selector": {"matchLabels": {"b": "2", "a": "1"}}}))
    assert parsed.selector == ex.Selector((("a", "1"), ("b", "2")), ())


def test_workload_names_of_a_pod_and_of_a_workload() -> None:
    pod = {
        "kind": "Pod",
        "apiVersion": "v1",
        "metadata": {
            "name": "web-5d8f7-x2k4p",
            "labels": {"pod-template-hash": "5d8f7", "training.kubeflow.org/job-name": "sft"},
            "ownerReferences": [{"kind": "ReplicaSet", "name": "web-5d8f7"}, "junk", {"kind": "Node"}],
        },
    }
    assert ex.workload_names(pod) == {"web-5d8f7-x2k4p", "web-5d8f7", "web", "sft"}
    deployment = {
        "kind": "Deployment",
        "apiVersion": "apps/v1",
        "metadata": {"name": "web", "labels": {"job-name": "x"}},
    }
    assert ex.workload_names(deployment) == {"web"}  # a workload's labels name nothing
    assert ex.workload_names({"kind": "Pod", "apiVersion": "v1", "metadata": None}) == frozenset()
    other_hash = copy.deepcopy(pod)
    other_hash["metadata"]["labels"]["pod-template-hash"] = "zzz"
    assert "web" not in ex.workload_names(other_hash)


def test_pod_labels_are_the_pods_or_the_templates() -> None:
    assert ex.pod_labels({"kind": "Pod", "apiVersion": "v1", "metadata": {"labels": {"a": "1"}}}) == [{"a": "1"}]
    dep = {"kind": "Deployment", "apiVersion": "apps/v1", "metadata": {"labels": {"x": "y"}},
           "spec": {"template": {"metadata": {"labels": {"b": "2"}}}}}  # fmt: skip
    assert ex.pod_labels(dep) == [{"b": "2"}]
    bare = {"kind": "Deployment", "apiVersion": "apps/v1", "spec": {"template": {"metadata": {"labels": "x"}}}}
    assert ex.pod_labels(bare) == [{}]


def test_is_exception_needs_the_kind_and_the_group() -> None:
    assert ex.is_exception(exception())
    assert not ex.is_exception({**exception(), "apiVersion": "kyverno.io/v2"})
    assert not ex.is_exception({**exception(), "kind": "PolicyException"})
    assert not ex.is_exception([exception()])


def test_covers_needs_rule_namespace_and_workload() -> None:
    e = ex.parse(exception())
    job = {**ELASTIC_JOB}
    assert e.covers("training-elastic-shrink", job, "ml")
    assert not e.covers("training-same-rack", job, "ml")
    assert not e.covers("training-elastic-shrink", job, "vision")
    assert not e.covers("training-elastic-shrink", {**job, "metadata": {"name": "other"}}, "ml")


def test_the_index_sorts_each_namespace_by_name() -> None:
    es = [ex.parse(exception(n, ns)) for n, ns in (("b", "ml"), ("a", "ml"), ("c", "cv"))]
    idx = ex.index(es)
    assert {k: [e.name for e in v] for k, v in idx.items()} == {"ml": ["a", "b"], "cv": ["c"]}


def test_check_until_on_update_counts_from_creation() -> None:
    now = time.time()
    e = ex.parse(exception(until=stamp(timedelta(days=200))))
    assert ex.check_until(e, now, created=now - 100 * 86400) == []
    assert "at most 366 days" in ex.check_until(e, now, created=now - 200 * 86400)[0]
    at_now = ex.parse(exception(until=stamp(timedelta(0))))
    assert ex.check_until(at_now, at_now.until)[0].endswith("must be in the future")


def test_enforcement_messages_are_exact() -> None:
    msg = enforcement_change(ns("warn"), ns("off"), ["dev"], trusted=("b-team", "a-team"))
    assert msg == (
        "changing namespace label gpu-admission.io/enforcement ('off' to 'warn') needs membership of group "
        "a-team or b-team (or system:masters). Fix: ask the platform team, or request a GPUPolicyException "
        "for the workload and rule at stake"
    )
    bad = enforcement_change(ns("x"), None, ["a-team"], trusted=("a-team",))
    assert bad == (
        "metadata.labels[gpu-admission.io/enforcement]: Unsupported value: 'x': supported values: "
        "enforce, warn, audit, off"
    )
    weird = {"metadata": {"labels": {"gpu-admission.io/enforcement": 5}}}
    assert enforcement_change(weird, None, ["dev"]) is None  # not a string: not a label the API server keeps


AT_THE_LIMIT = [
    {"rules": list(RULE_IDS)},
    {"workloads": {"names": [f"w{i}" for i in range(64)]}},
    {"workloads": {"names": ["a" * 253]}},
    {"workloads": {"selector": {"matchLabels": {f"k{i}": "v" for i in range(32)}}}},
    {"workloads": {"selector": {"matchLabels": {"a" * 253 + "/" + "b" * 63: "c" * 63}}}},
    {"workloads": {"selector": {"matchExpressions": [{"key": f"k{i}", "operator": "Exists"} for i in range(16)]}}},
    {"workloads": {"selector": {"matchExpressions": [{"key": "k", "operator": "In",
                                                      "values": [f"v{i}" for i in range(63)] + ["c" * 63]}]}}},
    {"reason": "r" * 1024, "requester": "q" * 253, "approver": "p" * 253},
]  # fmt: skip
PAST_THE_LIMIT = [
    ({"workloads": {"names": ["a" * 254]}}, "spec.workloads.names[0]"),
    ({"workloads": {"selector": {"matchLabels": {"a" * 254 + "/b": "c"}}}}, "must be a label key"),
    ({"workloads": {"selector": {"matchLabels": {"b" * 64: "c"}}}}, "must be a label key"),
    ({"workloads": {"selector": {"matchLabels": {"k": "c" * 64}}}}, "must be a label value"),
    ({"workloads": {"selector": {"matchExpressions": [{"key": "k", "operator": "In", "values": ["c" * 64]}]}}},
     "values[0]: Invalid value"),
    ({"reason": "r" * 1025}, "spec.reason: Too long: may not be more than 1024 characters"),
]  # fmt: skip


@pytest.mark.parametrize("spec", AT_THE_LIMIT, ids=range(len(AT_THE_LIMIT)))
def test_every_limit_is_inclusive(spec: dict[str, Any]) -> None:
    ex.parse(exception(**spec))


@pytest.mark.parametrize(("spec", "error"), PAST_THE_LIMIT, ids=[e for _, e in PAST_THE_LIMIT])
def test_one_past_a_limit_is_refused(spec: dict[str, Any], error: str) -> None:
    with pytest.raises(ex.ExceptionError) as info:
        ex.parse(exception(**spec))
    assert any(error in line for line in info.value.errors), info.value.errors


@pytest.mark.parametrize(
    ("spec", "errors"),
    [
        ({"rules": "x"}, ["spec.rules: Required value: name at least one rule id"]),
        ({"rules": ["x"]}, [f"spec.rules[0]: Unsupported value: 'x': supported values: {', '.join(RULE_IDS)}"]),
        ({"workloads": None}, ["spec.workloads: Required value: names and/or selector"]),
        ({"workloads": {"names": []}}, ["spec.workloads: Invalid value: must name workloads or give a selector"]),
        ({"workloads": {"names": "x"}}, ["spec.workloads.names: Invalid value: must be a list of names",
                                         "spec.workloads: Invalid value: must name workloads or give a selector"]),
        ({"until": None}, ["spec.until: Required value: an RFC 3339 date-time"]),
        ({"workloads": {"selector": {"matchExpressions": [{"key": "k", "operator": "Near"}]}}},
         ["spec.workloads.selector.matchExpressions[0].operator: Unsupported value: 'Near': supported values: "
          "In, NotIn, Exists, DoesNotExist"]),
    ],
)  # fmt: skip
def test_messages_are_exact(spec: dict[str, Any], errors: list[str]) -> None:
    with pytest.raises(ex.ExceptionError) as info:
        ex.parse(exception(**spec))
    assert info.value.errors == errors


def test_parse_keeps_every_field_and_defaults_the_namespace() -> None:
    obj = exception()
    e = ex.parse(obj)
    assert (e.reason, e.requester, e.approver, e.until_text) == ("trial, INC-1", "alice", "bob", obj["spec"]["until"])
    del obj["metadata"]["namespace"]
    assert ex.parse(obj).namespace == "default"
    assert ex.parse(obj, namespace="ml").namespace == "ml"


def test_until_at_exactly_the_longest_run_is_allowed() -> None:
    e = ex.parse(exception(until="2027-12-02T00:00:00Z"))
    start = e.until - ex.MAX_DAYS * 86400
    assert ex.check_until(e, start, created=start) == []
    assert ex.check_until(e, start, created=start - 1) != []


def test_no_api_version_is_not_an_exception_and_empty_names_are_no_names() -> None:
    assert not ex.is_exception({"kind": ex.KIND})
    assert ex.workload_names({"kind": "Pod", "apiVersion": "v1", "metadata": {"name": ""}}) == frozenset()
