"""Fuzzing every parser of outside input (issue #14): the three review endpoints (in process through the
handler behind them, and over real TLS against a `serve` process), the policy parser, the manifest loader,
the audit reader, and the nesting-depth check they share. Each target may answer, refuse with its one-line
error, or skip, and nothing else: no other exception, no traceback, no dead server.

Bounded for CI: a fixed number of examples per target (about a minute in all on a loaded 2-core machine);
`FUZZ_EXAMPLES=5000 python -m pytest tests/test_fuzz.py` runs longer.
"""

from __future__ import annotations

import asyncio
import io
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from policies import inventory
from policies.document import PolicyError, default_policy_text, parse_policy_text
from policies.engine import review
from policies.limits import MAX_DEPTH, json_too_deep, walk_too_deep
from tests.serverproc import ServerProcess
from webhook.app import ServerConfig, create_app
from webhook.cli import UsageError
from webhook.cli import main as cli_main
from webhook.cmd_audit import Reader
from webhook.manifests import Limits, ManifestError, load_objects, parse_documents
from webhook.state import State

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = int(os.environ.get("FUZZ_EXAMPLES", "150"))
FUZZ = settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck), derandomize=False)

# JSON values: scalars, and containers up to a modest depth; `deep` values go past the limit on purpose.
ints = st.integers(-(2**63), 2**63 - 1)
scalars = st.none() | st.booleans() | ints | st.floats(allow_nan=False) | st.text(max_size=20)
json_values = st.recursive(
    scalars,
    lambda kids: st.lists(kids, max_size=4) | st.dictionaries(st.text(max_size=8), kids, max_size=4),
    max_leaves=30,
)


@st.composite
def deep(draw: Any) -> Any:
    value = draw(json_values)
    for _ in range(draw(st.integers(0, 2 * MAX_DEPTH))):
        value = [value] if draw(st.booleans()) else {draw(st.text(max_size=3)): value}
    return value


POD = {
    "apiVersion": "v1",
    "kind": "Pod",
    "metadata": {"name": "p", "namespace": "ml", "annotations": {"gpu-admission.io/gpu-memory": "10Gi"}},
    "spec": {"containers": [{"name": "c", "image": "x", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]},
}


@st.composite
def reviews(draw: Any) -> bytes:
    """Bodies from garbage to well-formed AdmissionReviews whose object is a pod with random parts."""
    kind = draw(st.integers(0, 3))
    if kind == 0:
        return bytes(draw(st.binary(max_size=200)))
    if kind == 1:
        return orjson.dumps(draw(deep()))
    obj: Any = draw(st.sampled_from([POD, {**POD, "spec": draw(deep())}, draw(deep())]))
    if kind == 3 and isinstance(obj, dict):
        obj = {**obj, "metadata": {**POD["metadata"], "annotations": draw(st.dictionaries(st.sampled_from(
            ["gpu-admission.io/gpu-memory", "gpu-admission.io/latency", "gpu-admission.io/job-gpus", "x"]),
            st.text(max_size=12), max_size=3))}}  # fmt: skip
    request = {
        "uid": draw(st.sampled_from(["u", ""])) or draw(st.text(max_size=5)),
        "operation": draw(st.sampled_from(["CREATE", "UPDATE", "DELETE", "CONNECT", "PATCH"])),
        "object": obj,
        "namespace": draw(st.sampled_from(["ml", "", None])),
        "userInfo": draw(st.sampled_from([{"username": "a", "groups": ["g"]}, None, {"groups": 3}])),
    }
    return orjson.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request})


def check_answer(status: int, payload: bytes, body: bytes) -> None:
    assert status in (200, 400, 413, 429), (status, payload)
    answer = orjson.loads(payload)
    if status == 200:
        assert answer["response"]["uid"] == orjson.loads(body)["request"]["uid"]
        assert isinstance(answer["response"]["allowed"], bool)
    else:
        assert set(answer) == {"error"} and "\n" not in answer["error"]


# -- the review endpoints ---------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def handler() -> Any:
    state = State()
    state.set_nodes(load_objects([str(ROOT / "examples" / "cluster" / "nodes.yaml")]), "file")
    app = create_app(state, config=ServerConfig(policy_configmap=("gpu-admission", "policy")))
    return app.state.review_bytes


@FUZZ
@given(body=reviews(), webhook=st.sampled_from(["admit", "mutate", "validate"]))
def test_fuzz_review_handler(handler: Any, body: bytes, webhook: str) -> None:
    status, payload = asyncio.run(handler(body, webhook, None))
    check_answer(status, payload, body)


@pytest.fixture(scope="module")
def server() -> Iterator[ServerProcess]:
    srv = ServerProcess()
    yield srv
    assert srv.proc.poll() is None, srv.log_tail()
    assert "Traceback" not in srv.log_tail(100_000)
    srv.stop()


@settings(max_examples=max(EXAMPLES // 3, 20), deadline=None, suppress_health_check=list(HealthCheck))
@given(body=reviews(), path=st.sampled_from(["/admit", "/mutate", "/validate"]), query=st.text(max_size=12))
def test_fuzz_review_endpoints_over_tls(server: ServerProcess, body: bytes, path: str, query: str) -> None:
    with server.client() as c:
        r = c.post(path, params={"timeout": query}, content=body)
    check_answer(r.status_code, r.content, body)


# -- the policy parser --------------------------------------------------------------------------------------------

DEFAULT = yaml.safe_load(default_policy_text())
numbers = st.integers(-(2**70), 2**70) | st.floats() | st.sampled_from([".nan", ".inf", "1e999", "-1", "16Mi"])


@st.composite
def policies(draw: Any) -> str:
    """The built-in policy with random values put at random known places, or random YAML-ish text."""
    if draw(st.integers(0, 4)) == 0:
        return draw(st.text(max_size=300))
    doc = orjson.loads(orjson.dumps(DEFAULT))
    doc["pools"] = doc.get("pools") or [{"name": "p", "nodeSelector": {"a": "b"}}]
    places = [
        ("comm", "messageSize"), ("comm", "nvlinkGbps"), ("comm", "networkGbps"), ("comm", "crossRackOversubscription"),
        ("inference", "warmPool"), ("pools", 0, "nodes"), ("pools", 0, "gpusPerNode"), ("pools", 0, "replicas"),
        ("pools", 0, "migProfiles"), ("training", "schedulerName"), ("rules",), ("gpuNodes", "tolerations"),
    ]  # fmt: skip
    for _ in range(draw(st.integers(1, 4))):
        *where, key = draw(st.sampled_from(places))
        node: Any = doc
        for step in where:
            node = node.setdefault(step, {}) if isinstance(step, str) else node[step]
        node[key] = draw(numbers | json_values | deep())
    text = yaml.safe_dump(doc, sort_keys=False)
    # YAML's own spellings of the non-finite floats (safe_dump writes them so already; strings say them too)
    return text.replace("'.nan'", ".nan").replace("'.inf'", ".inf")


@FUZZ
@given(text=policies())
def test_fuzz_policy_parser(text: str) -> None:
    """Any text is a policy or a PolicyError of one-line messages; an accepted policy never breaks a rule."""
    try:
        policy = parse_policy_text(text)
    except PolicyError as exc:
        assert exc.errors and all("\n" not in e and len(e) < 400 for e in exc.errors), exc.errors
        return
    r = review(dict(POD), policy=policy, inventory=inventory.build((), policy))
    assert not [x for x in r.results if x.outcome == "error"], r.results


# -- the manifest loader ------------------------------------------------------------------------------------------

yaml_texts = st.one_of(
    st.text(max_size=300),
    json_values.map(lambda v: yaml.safe_dump(v)),
    deep().map(lambda v: orjson.dumps(v).decode()),
    st.lists(
        st.sampled_from(["---\n", "a: &x [1, 2]\n", "b: [*x, *x]\n", "- *x\n", "kind: Pod\n", "apiVersion: v1\n",
                         "items: []\n", "{[\n", "!!python/object:os.system\n", "? [a]\n: b\n"]),
        max_size=12,
    ).map("".join),
)  # fmt: skip


@FUZZ
@given(text=yaml_texts)
def test_fuzz_manifest_loader(text: str, tmp_path_factory: pytest.TempPathFactory) -> None:
    try:
        docs = parse_documents(text, "f", Limits(max_objects=50))
    except ManifestError as exc:
        assert "\n" not in str(exc) and str(exc).startswith("f")
        return
    assert isinstance(docs, list)
    path = tmp_path_factory.mktemp("m") / "m.yaml"
    path.write_text(text)
    try:
        objects = load_objects([str(path)], Limits(max_bytes=4096, max_objects=50))
    except ManifestError as exc:
        assert "\n" not in str(exc)
        return
    assert all(isinstance(o, dict) and isinstance(o.get("kind"), str) for o in objects)


# -- the audit reader ---------------------------------------------------------------------------------------------

audit_lines = st.one_of(
    st.binary(max_size=120),
    deep().map(orjson.dumps),
    st.fixed_dictionaries(
        {"time": st.sampled_from(["2026-12-01T10:00:00.000Z", "x", "2026-13-01"]) | ints,
         "verdict": st.sampled_from(["allow", "deny", "warn", "nope"]), "uid": json_values},
        optional={"latencyMs": scalars, "rules": json_values, "namespace": scalars, "kind": scalars},
    ).map(orjson.dumps),
)  # fmt: skip


@FUZZ
@given(lines=st.lists(audit_lines, max_size=8))
def test_fuzz_audit_reader(lines: list[bytes]) -> None:
    reader = Reader()
    data = b"\n".join(lines)
    try:
        entries = list(reader._lines("fuzz", io.BytesIO(data)))
    except UsageError as exc:  # a gzip magic number on a stream that is no gzip: one line, exit 2
        assert data.startswith(b"\x1f\x8b") and "\n" not in str(exc) and str(exc).startswith("cannot read fuzz: ")
        return
    assert reader.records == len(entries) and reader.records + reader.skipped <= data.count(b"\n") + 1


@settings(max_examples=max(EXAMPLES // 5, 10), deadline=None, suppress_health_check=list(HealthCheck))
@given(lines=st.lists(audit_lines, max_size=8), summary=st.booleans())
def test_fuzz_audit_command(lines: list[bytes], summary: bool, tmp_path_factory: pytest.TempPathFactory) -> None:
    path = tmp_path_factory.mktemp("a") / "audit.log"
    path.write_bytes(b"\n".join(lines))
    assert cli_main(["audit", str(path), *(["--summary"] if summary else []), "-o", "json"]) in (0, 2)


# -- the depth check they share -------------------------------------------------------------------------------


@settings(max_examples=EXAMPLES * 2, deadline=None)
@given(value=deep(), limit=st.integers(1, 260))
def test_fuzz_depth_check_agrees_with_a_walk(value: Any, limit: int) -> None:
    assert json_too_deep(value, limit) == walk_too_deep(value, limit)
