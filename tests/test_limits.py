"""Hostile input on every parse path that is not the server (issue #14, items 1, 5 and 8): deep nesting, alias
bombs, endless or huge input, and policies whose numbers are out of range. Each ends in one line and exit 2
(`check`), exit 1 (`policy validate`) or a reported reload failure, with bounded memory, never a traceback.

The CLI runs as a user runs it (`python -m webhook` in a subprocess); its peak RSS is the child's own
`ru_maxrss` from wait4().
"""

from __future__ import annotations

import copy
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import orjson
import pytest

from policies.document import MAX_POOL_NODES, PolicyError, parse_policy_text
from policies.engine import review
from policies.limits import MAX_DEPTH, LimitError, check_yaml, json_too_deep
from webhook import admission
from webhook.state import State

ROOT = Path(__file__).resolve().parent.parent
RSS_LIMIT_MIB = 256  # the Deployment's memory limit
POD_HEAD = "apiVersion: v1\nkind: Pod\nmetadata: {name: p, namespace: ml}\n"


# `python -m webhook ARGS`, writing its own peak resident set (VmHWM of its address space since exec) to a file
# at exit. Not wait4()'s ru_maxrss: Linux carries a forking parent's high-water mark into the child across exec,
# so in a long pytest run every child would report the test process's own peak.
_CLI = """import atexit, os, sys
from webhook.cli import main

def _peak():
    with open("/proc/self/status") as f:
        kib = next(line.split()[1] for line in f if line.startswith("VmHWM:"))
    with open(os.environ["PEAK_FILE"], "w") as out:
        out.write(kib)

atexit.register(_peak)
sys.exit(main(sys.argv[1:]))
"""


def run_cli(*args: str, stdin: bytes | None = None, timeout: float = 120) -> tuple[int, str, float]:
    """(exit code, stderr, peak RSS in MiB) of `python -m webhook ARGS`."""
    with tempfile.NamedTemporaryFile(suffix=".peak") as peak:
        proc = subprocess.run(
            [sys.executable, "-c", _CLI, *args],
            cwd=ROOT,
            input=stdin,
            stdin=None if stdin is not None else subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            env={**os.environ, "PEAK_FILE": peak.name, "PYTHONPATH": str(ROOT)},
            timeout=timeout,
            check=False,
        )
        kib = Path(peak.name).read_text() or "0"
    return proc.returncode, proc.stderr.decode(errors="replace"), int(kib) / 1024


def nested(depth: int) -> str:
    return "[" * depth + "]" * depth


def alias_bomb(levels: int = 9) -> str:
    lines = ['    a0: &a0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    for i in range(1, levels):
        lines.append(f"    a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 9) + "]")
    return POD_HEAD + "spec:\n  containers: [{name: c, image: x}]\n  x:\n" + "\n".join(lines) + "\n"


def assert_one_line(rc: int, err: str, rss: float, *, expect: str, code: int = 2) -> None:
    assert rc == code, err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert expect in err, err
    assert rss <= RSS_LIMIT_MIB, f"peak RSS {rss:.0f} MiB"


# -- the limits themselves ---------------------------------------------------------------------------------


def test_json_depth_is_counted_exactly() -> None:
    value: Any = 1
    for _ in range(MAX_DEPTH):
        value = [value]
    assert not json_too_deep(value)
    assert json_too_deep([value])
    assert not json_too_deep({"a": {"b": [1, 2, {"c": 3}]}}, limit=4)
    assert json_too_deep({"a": {"b": [1, 2, {"c": {}}]}}, limit=4)


def test_yaml_depth_counts_aliases_at_their_depth() -> None:
    deep = (
        "a: &x "
        + nested(60)
        + "\nb: [[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[*x]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]\n"
    )
    with pytest.raises(LimitError, match="an alias nests deeper than 100 levels"):
        check_yaml(deep, "f")
    assert check_yaml("a: &x " + nested(60) + "\nb: [*x]\n", "f") == 1


def test_yaml_alias_bomb_is_bounded_before_any_object_is_built() -> None:
    started = time.perf_counter()
    with pytest.raises(LimitError, match="aliases expand to more than 100000 nodes"):
        check_yaml(alias_bomb(), "f")
    assert time.perf_counter() - started < 5
    check_yaml(alias_bomb(levels=3), "f")  # 9^3 expanded nodes: fine


def test_an_object_at_the_depth_limit_still_gets_a_decision() -> None:
    """The limit is below what the engine handles: a 100-level object is reviewed, mutated and diffed."""
    deep: Any = "leaf"
    for _ in range(MAX_DEPTH - 1):  # with the pod around it: exactly MAX_DEPTH levels
        deep = {"x": deep}
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "p", "namespace": "ml"},
        "spec": {"containers": [{"name": "c", "image": "x", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]},
        "deep": deep,
    }
    assert not json_too_deep(pod) and json_too_deep({"w": pod})
    body = {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {"uid": "u"}}
    body["request"].update(operation="CREATE", object=pod)
    with pytest.raises(admission.BadRequest, match="nests deeper than 100 levels"):
        admission.parse(orjson.dumps(body))
    from policies import inventory
    from policies.document import default_policy

    policy = default_policy()
    r = review(copy.deepcopy(pod), policy=policy, inventory=inventory.build((), policy))
    assert r.allowed and r.handled and r.object["deep"] == deep


def test_admission_requests_nested_100000_deep_are_a_bad_request() -> None:
    for depth in (MAX_DEPTH + 1, 2000, 100_000):
        body = (
            b'{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"object":'
            + nested(depth).encode()
            + b"}}"
        )
        with pytest.raises(admission.BadRequest):
            admission.parse(body)


# -- the CLI: check ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("suffix", [".yaml", ".json"])
def test_check_rejects_manifests_nested_100000_deep(tmp_path: Path, suffix: str) -> None:
    f = tmp_path / f"deep{suffix}"
    f.write_text('{"apiVersion": "v1", "kind": "Pod", "spec": ' + nested(100_000) + "}")
    rc, err, rss = run_cli("check", "-f", str(f))
    assert_one_line(rc, err, rss, expect="nested deeper than 100 levels")


def test_check_rejects_an_alias_bomb_inside_a_pod(tmp_path: Path) -> None:
    f = tmp_path / "bomb.yaml"
    f.write_text(alias_bomb())
    rc, err, rss = run_cli("check", "-f", str(f))
    assert_one_line(rc, err, rss, expect="aliases expand to more than 100000 nodes")


def test_check_stops_reading_dev_zero_at_the_input_limit() -> None:
    rc, err, rss = run_cli("check", "-f", "/dev/zero")
    assert_one_line(rc, err, rss, expect="/dev/zero: input exceeds the 33554432-byte limit")
    rc, err, rss = run_cli("check", "-f", "/dev/zero", "--max-input", "1Mi")
    assert_one_line(rc, err, rss, expect="exceeds the 1048576-byte limit")


def test_check_on_100_mb_of_small_pods_ends_at_once_with_bounded_memory() -> None:
    pod = (POD_HEAD + "spec: {containers: [{name: c, image: x}]}\n---\n").encode()
    data = pod * (100 * 2**20 // len(pod))
    started = time.monotonic()
    rc, err, rss = run_cli("check", "-f", "-", stdin=data)
    assert_one_line(rc, err, rss, expect="<stdin>: input exceeds the 33554432-byte limit")
    assert time.monotonic() - started < 30
    # Within the byte limit but past the object limit: stopped while counting documents, before loading.
    rc, err, rss = run_cli("check", "-f", "-", "--max-input", "200Mi", stdin=data)
    assert_one_line(rc, err, rss, expect="more than 20000 documents")


def test_check_object_limit_counts_list_items(tmp_path: Path) -> None:
    items = [{"apiVersion": "v1", "kind": "Pod", "metadata": {"name": f"p{i}"}} for i in range(30)]
    f = tmp_path / "list.json"
    f.write_bytes(orjson.dumps({"apiVersion": "v1", "kind": "List", "items": items}))
    rc, err, rss = run_cli("check", "-f", str(f), "--max-objects", "20")
    assert_one_line(rc, err, rss, expect="more than 20 objects")
    rc, err, _ = run_cli("check", "-f", str(f), "--max-objects", "30")
    assert rc == 0, err


# -- policies -----------------------------------------------------------------------------------------------

POLICY_HEAD = "apiVersion: gpu-admission.io/v1alpha1\nkind: Policy\n"


@pytest.mark.parametrize(
    ("body", "error"),
    [
        ("pools:\n- {name: p, nodeSelector: {a: b}, nodes: 100000000}\n", "pools[0].nodes (line 4): must be between"),
        ("comm: {messageSize: 1e999}\n", "comm.messageSize (line 3): must be positive and at most 1Ti"),
        ("comm: {messageSize: .inf}\n", "comm.messageSize (line 3): must be a finite size"),
        ("comm: {networkGbps: .nan}\n", "comm.networkGbps (line 3): must be a finite number, got nan"),
        ("comm: {nvlinkGbps: .inf}\n", "comm.nvlinkGbps (line 3): must be a finite number, got inf"),
        ("comm: {crossRackOversubscription: 1.0e+9}\n", "must be at least 1 and at most 1000, got 1000000000.0"),
        ("comm: {crossRackOversubscription: 0.5}\n", "comm.crossRackOversubscription (line 3): must be at least 1 and"),
        ("inference: {warmPool: 10000000000}\n", "inference.warmPool (line 3): must be between 0 and 100000"),
        ("pools:\n- {name: p, nodeSelector: {a: b}, gpusPerNode: 100000}\n", "gpusPerNode (line 4): must be between"),
        ("pools:\n- {name: p, nodeSelector: {a: b}, migProfiles: {1g.10gb: 99999999}}\n", "slice counts must be"),
        ("rules: " + nested(1000) + "\n", "line 3, column 107: nested deeper than 100 levels"),
        ("training: {schedulerName: " + "x" * 5000 + "}\n", "must be at most 1024 characters"),
        ("gpuNodes: {tolerations: [" + ", ".join(["{key: k}"] * 1001) + "]}\n", "at most 1000 entries, got 1001"),
    ],
)
def test_policy_numbers_sizes_and_depth_are_bounded(body: str, error: str) -> None:
    with pytest.raises(PolicyError) as exc:
        parse_policy_text(POLICY_HEAD + body)
    assert any(error in e for e in exc.value.errors), exc.value.errors


def test_declared_pool_nodes_are_bounded_in_all() -> None:
    pools = "".join(f"- {{name: p{i}, nodeSelector: {{a: b{i}}}, nodes: {MAX_POOL_NODES // 2}}}\n" for i in range(3))
    with pytest.raises(PolicyError, match="declare at most 10000 nodes in all, got 15000"):
        parse_policy_text(POLICY_HEAD + "pools:\n" + pools)


def test_policy_larger_than_a_configmap_is_refused_unparsed() -> None:
    with pytest.raises(PolicyError, match="larger than 1048576 bytes"):
        parse_policy_text(POLICY_HEAD + "#" * 2**20)


def test_policy_validate_prints_one_line_per_error_for_hostile_policies(tmp_path: Path) -> None:
    deep = tmp_path / "deep.yaml"
    deep.write_text(POLICY_HEAD + "rules: " + nested(1000) + "\n")
    out = subprocess.run(
        [sys.executable, "-m", "webhook", "policy", "validate", str(deep)], cwd=ROOT, capture_output=True, text=True
    )
    assert out.returncode == 1 and "Traceback" not in out.stderr
    assert out.stderr.strip() == f"{deep}: line 3, column 107: nested deeper than 100 levels", out.stderr
    bomb = tmp_path / "bomb.yaml"
    bomb.write_text(POLICY_HEAD + alias_bomb().replace(POD_HEAD, "").replace("spec:", "topology:"))
    rc, err, rss = run_cli("check", "-f", str(ROOT / "examples" / "training"), "--policy", str(bomb))
    assert_one_line(rc, err, rss, expect="aliases expand to more than 100000 nodes")


def test_a_policy_edit_with_a_nan_would_have_broken_a_rule_on_every_review() -> None:
    """What the limit prevents: with `networkGbps: .nan` accepted, training-same-rack raised on every review
    (and with failureMode: open, a job it must deny was allowed). The document is refused instead."""
    text = POLICY_HEAD + "failureMode: open\ncomm: {networkGbps: .nan, nvlinkGbps: .inf}\n"
    with pytest.raises(PolicyError) as exc:
        parse_policy_text(text)
    assert len(exc.value.errors) == 2


# -- the policy watcher ---------------------------------------------------------------------------------------


def _wait(pred: Any, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(0.02)
    return False


def _policy(warm: int) -> str:
    return POLICY_HEAD + f"inference: {{warmPool: {warm}}}\n"


def test_watcher_survives_memory_and_recursion_errors_and_reports_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import webhook.state as state_mod

    path = tmp_path / "policy.yaml"
    path.write_text(_policy(1))
    state = State()
    state.watch_policy_file(str(path), interval=0.05, settle=0.05)
    real = state_mod.parse_policy_text
    faults = iter([MemoryError(), RecursionError("maximum recursion depth exceeded")])

    def failing(text: str) -> Any:
        fault = next(faults, None)
        if fault is not None:
            raise fault
        return real(text)

    monkeypatch.setattr(state_mod, "parse_policy_text", failing)
    try:
        # Each edit changes the size too: two writes in one tick of the file system clock share an mtime.
        for warm, failures in ((22, 1), (333, 2)):
            path.write_text(_policy(warm))
            assert _wait(lambda f=failures: state.status.reload_failures == f), state.status  # type: ignore[misc]
            details = state.ready()[1]
            assert "reload failed: " in details["policy"]["error"] and details["policy"]["reloadFailures"] == failures
        path.write_text(_policy(4444))  # the thread is alive: the next edit loads
        assert _wait(lambda: state.snapshot().policy.warm_pool == 4444)
        assert state.status.policy_error is None
    finally:
        state.stop()


def test_watcher_does_not_serve_a_half_written_file(tmp_path: Path) -> None:
    """A writer that stops half-way for less than the settle time: the prefix (valid YAML, a different policy)
    never loads; the whole file does."""
    path = tmp_path / "policy.yaml"
    path.write_text(_policy(1))
    state = State()
    loaded: list[int] = []
    state.watch_policy_file(str(path), interval=0.05, settle=0.4)
    state.on_policy_change.append(lambda p: loaded.append(p.warm_pool))
    full = _policy(7) + "training: {schedulerName: volcano}\n"
    prefix = _policy(5)  # the first lines of `full` with another number: a valid policy of its own
    try:
        with open(path, "w") as f:
            f.write(prefix)
            f.flush()
            time.sleep(0.2)
            f.seek(0)
            f.write(full)
        assert _wait(lambda: state.snapshot().policy.warm_pool == 7)
        assert loaded == [7], loaded
    finally:
        state.stop()


def test_configmap_reload_failure_of_any_kind_is_reported() -> None:
    state = State()
    assert not state.load_policy_text(POLICY_HEAD + "rules: " + nested(1000), "configmap:x/y")
    assert state.status.reload_failures == 1 and "nested deeper than 100 levels" in str(state.status.policy_error)


# -- the audit reader ---------------------------------------------------------------------------------------


def test_audit_skips_a_line_nested_100000_deep_and_an_endless_line(tmp_path: Path) -> None:
    good = b'{"time":"2026-12-01T10:00:00.000Z","verdict":"deny","uid":"u1","kind":"Pod","namespace":"ml"}\n'
    log = tmp_path / "audit.log"
    log.write_bytes(
        good + b'{"a":' * 100_000 + b"1" + b"}" * 100_000 + b"\n" + b"{" + b"x" * (5 * 2**20) + b"\n" + good
    )
    out = subprocess.run(
        [sys.executable, "-m", "webhook", "audit", str(log), "-o", "json"], cwd=ROOT, capture_output=True, timeout=60
    )
    assert out.returncode == 0 and b"Traceback" not in out.stderr, out.stderr
    assert [r["uid"] for r in orjson.loads(out.stdout)] == ["u1", "u1"]
    assert b"skipped 2 line(s) that are not audit records" in out.stderr
