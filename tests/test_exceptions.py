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
