"""`gpu-admission audit` on logs recorded by AuditLog (rotated, gzipped, mixed with other output)."""

from __future__ import annotations

import gzip
import os
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from webhook.audit import AuditLog, format_time
from webhook.cli import UsageError, main
from webhook.cmd_audit import Summary, parse_duration, render_table

ROOT = Path(__file__).resolve().parents[1]
ENV = {**{k: v for k, v in os.environ.items() if k != "COLUMNS"}, "PYTHONPATH": str(ROOT)}


def decision(
    i: int,
    *,
    minutes_ago: float,
    verdict: str = "allow",
    namespace: str = "ml",
    kind: str = "Pod",
    name: str | None = None,
    user: str = "alice",
    rules: list[tuple[str, str]] | None = None,
    dry_run: bool = False,
    latency: float = 0.5,
) -> dict[str, Any]:
    return {
        "time": format_time(time.time() - minutes_ago * 60),
        "uid": f"uid-{i}",
        "dryRun": dry_run,
        "webhook": "validate",
        "user": user,
        "groups": ["system:authenticated"],
        "operation": "CREATE",
        "apiVersion": "v1",
        "kind": kind,
        "namespace": namespace,
        "name": name if name is not None else f"pod-{i}",
        "workload": "training",
        "verdict": verdict,
        "rules": [
            {"rule": r, "action": "enforce" if o == "deny" else o, "outcome": o, "message": f"{r}: {o}"}
            for r, o in rules or []
        ],
        "mutations": [],
        "warnings": [f"{r}: warn" for r, o in rules or [] if o == "warn"],
        "patch": [],
        "policyHash": "sha256:abc",
        "latencyMs": latency,
    }


def decisions() -> list[dict[str, Any]]:
    """12 decisions over the last 3 hours, oldest first, timed from now: `--since` compares with the clock at
    the query, so records made at import time would drift towards the window's edge in a long test run."""
    return [
        decision(
            0,
            minutes_ago=170,
            verdict="deny",
            rules=[("training-same-rack", "deny")],
            kind="PyTorchJob",
            name="bert",
            latency=1.0,
        ),
        decision(
            1,
            minutes_ago=160,
            verdict="deny",
            rules=[("training-same-rack", "deny")],
            kind="PyTorchJob",
            name="bert",
            latency=2.0,
        ),
        decision(2, minutes_ago=150, verdict="warn", rules=[("training-queue-priority", "warn")], latency=3.0),
        decision(3, minutes_ago=140, namespace="serving", kind="Deployment", user="bob", latency=4.0),
        decision(
            4,
            minutes_ago=100,
            verdict="deny",
            namespace="serving",
            kind="Deployment",
            name="llama",
            rules=[("online-no-timeslice", "deny"), ("training-queue-priority", "warn")],
            latency=5.0,
        ),
        decision(
            5,
            minutes_ago=90,
            dry_run=True,
            verdict="deny",
            rules=[("training-same-rack", "deny")],
            kind="PyTorchJob",
            name="bert",
            latency=6.0,
        ),
        decision(
            6,
            minutes_ago=80,
            namespace="ci",
            kind="Job",
            user="system:serviceaccount:ci:runner",
            rules=[("gpu-request-fits", "audit")],
            latency=7.0,
        ),
        decision(7, minutes_ago=50, latency=8.0),
        decision(
            8,
            minutes_ago=40,
            verdict="warn",
            namespace="serving",
            rules=[("training-queue-priority", "warn")],
            latency=9.0,
        ),
        decision(9, minutes_ago=30, user="bob", latency=10.0),
        decision(10, minutes_ago=10, namespace="ci", kind="Job", latency=11.0),
        decision(11, minutes_ago=5, verdict="deny", rules=[("training-elastic-shrink", "deny")], latency=100.0),
    ]


@pytest.fixture
def logged(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[dict[str, Any]]]:
    """The decisions written by a real AuditLog with rotation and gzip (current + several .N.gz files), and
    the records as written."""
    d = tmp_path_factory.mktemp("logs")
    records = decisions()
    with AuditLog(d / "audit.log", max_bytes=1500, backups=20, compress=True) as log:
        for r in records:
            log.record(r)
    assert any(p.name.endswith(".gz") for p in d.iterdir())
    return d, records


@pytest.fixture
def logdir(logged: tuple[Path, list[dict[str, Any]]]) -> Path:
    return logged[0]


def run(*args: str, stdin: bytes = b"") -> subprocess.CompletedProcess[str]:
    """`python -m webhook audit ARGS` in a real process, stdin a pipe (empty unless given)."""
    done = subprocess.run(
        [sys.executable, "-m", "webhook", "audit", *args],
        input=stdin,
        capture_output=True,
        cwd=ROOT,
        env=ENV,
        timeout=60,
    )
    return subprocess.CompletedProcess(done.args, done.returncode, done.stdout.decode(), done.stderr.decode())


def query(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[list[str], str]:
    """In-process `audit ARGS -o json`: the uids printed, and stderr."""
    assert main(["audit", *args, "-o", "json"]) == 0
    out, err = capsys.readouterr()
    return [r["uid"] for r in orjson.loads(out)], err


def uids(capsys: pytest.CaptureFixture[str], *args: str) -> list[str]:
    return query(capsys, *args)[0]


def ids(*numbers: int) -> list[str]:
    return [f"uid-{n}" for n in numbers]


# -- reading ---------------------------------------------------------------------------------------------


def test_directory_of_rotated_and_gzipped_files_in_time_order(logdir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert uids(capsys, str(logdir)) == ids(*range(12))


def test_glob_and_explicit_files(logdir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert uids(capsys, str(logdir / "audit.log*")) == ids(*range(12))
    files = sorted(str(p) for p in logdir.iterdir())
    assert uids(capsys, *files, str(logdir)) == ids(*range(12))  # the same file twice is read once


def test_two_workers_logs_are_merged_by_time(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with AuditLog(tmp_path / "worker-0.log") as a, AuditLog(tmp_path / "worker-1.log") as b:
        for i, r in enumerate(decisions()):
            (a if i % 2 else b).record(r)
    assert uids(capsys, str(tmp_path)) == ids(*range(12))


def test_stale_rotation_leftovers_are_not_read_twice(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # A kill between writing audit.log.1.gz and removing audit.log.1 leaves both; plus a half-written .tmp.
    plain = b"".join(orjson.dumps(r) + b"\n" for r in decisions()[:6])
    (tmp_path / "audit.log.1").write_bytes(plain)
    (tmp_path / "audit.log.1.gz").write_bytes(gzip.compress(plain))
    (tmp_path / "audit.log.2.gz.tmp").write_bytes(gzip.compress(plain)[:20])
    (tmp_path / "audit.log").write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in decisions()[6:]))
    assert uids(capsys, str(tmp_path)) == ids(*range(12))


def test_kubectl_logs_on_stdin_with_noise_is_filtered_and_counted() -> None:
    lines = [
        "INFO:     Started server process [1]",
        'INFO:     10.0.0.1:51234 - "POST /validate?timeout=10s HTTP/1.1" 200 OK',
        '{"level":"info","time":"2026-11-30T08:00:00Z","msg":"policy reloaded"}',  # JSON, not an audit record
        *(f"[pod/gpu-admission-7d9f/webhook] {orjson.dumps(r).decode()}" for r in decisions()[:3]),
        *(f"2026-11-30T08:00:00.000000000Z {orjson.dumps(r).decode()}" for r in decisions()[3:5]),
        orjson.dumps(decisions()[5]).decode()[:40],  # a line cut short
        "",
    ]
    result = run("-", "-o", "json", stdin="\n".join(lines).encode())
    assert result.returncode == 0, result.stderr
    assert [r["uid"] for r in orjson.loads(result.stdout)] == ids(0, 1, 2, 3, 4)
    assert result.stderr.strip() == "gpu-admission audit: skipped 4 line(s) that are not audit records"


def test_piped_stdin_is_the_default_and_may_be_gzip(logdir: Path) -> None:
    gz = sorted(logdir.glob("*.gz"))[0]
    result = run("-o", "json", stdin=gz.read_bytes())  # e.g. `cat audit.log.3.gz | gpu-admission audit`
    assert result.returncode == 0, result.stderr
    expected = [orjson.loads(line)["uid"] for line in gzip.decompress(gz.read_bytes()).splitlines()]
    assert [r["uid"] for r in orjson.loads(result.stdout)] == expected != []


def test_malformed_lines_in_a_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "mixed.log"
    with AuditLog(path) as log:
        log.record(decisions()[0])
    with path.open("ab") as f:
        f.write(b'not json at all\n{"uid": "x", "verdict": "maybe", "time": "2026-11-30T08:00:00Z"}\n')
        f.write(b'{"uid": "y", "verdict": "allow", "time": "yesterday"}\n[1, 2]\n\xff\xfe\n')
    assert query(capsys, str(path)) == (
        ids(0),
        "gpu-admission audit: skipped 5 line(s) that are not audit records\n",
    )


# -- filters ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--namespace", "serving"], [3, 4, 8]),
        (["--rule", "training-same-rack"], [0, 1, 5]),
        (["--rule", "training-queue-priority"], [2, 4, 8]),  # warned, also next to a denial
        (["--rule", "gpu-request-fits"], [6]),  # audit outcome
        (["--verdict", "deny"], [0, 1, 4, 5, 11]),
        (["--verdict", "warn"], [2, 8]),
        (["--user", "bob"], [3, 9]),
        (["--kind", "pytorchjob"], [0, 1, 5]),
        (["--dry-run", "only"], [5]),
        (["--dry-run", "exclude", "--verdict", "deny"], [0, 1, 4, 11]),
        (["--since", "1h"], [7, 8, 9, 10, 11]),
        (["--since", "95m", "--namespace", "ml"], [5, 7, 9, 11]),
        (["--since", "2h30m", "--verdict", "deny", "--dry-run", "exclude"], [4, 11]),
        (["--since", "1d"], list(range(12))),
    ],
)
def test_filters(logdir: Path, capsys: pytest.CaptureFixture[str], args: list[str], expected: list[int]) -> None:
    assert uids(capsys, str(logdir), *args) == ids(*expected)


def test_json_output_is_the_records_unchanged(
    logged: tuple[Path, list[dict[str, Any]]], capsys: pytest.CaptureFixture[str]
) -> None:
    logdir, records = logged
    assert main(["audit", str(logdir), "-o", "json"]) == 0
    assert orjson.loads(capsys.readouterr().out) == records


def test_no_match_is_exit_0_with_a_line(logdir: Path) -> None:
    result = run(str(logdir), "--namespace", "nowhere")
    assert result.returncode == 0 and result.stdout == ""
    inputs = len(list(logdir.iterdir()))
    assert result.stderr == f"gpu-admission audit: no audit records matched (12 audit record(s) in {inputs} input(s))\n"
    result = run(str(logdir), "--namespace", "nowhere", "-o", "json")
    assert result.returncode == 0 and orjson.loads(result.stdout) == []


# -- table -----------------------------------------------------------------------------------------------


def test_table_fits_120_columns_and_truncates(tmp_path: Path) -> None:
    long = decision(
        99,
        minutes_ago=1,
        verdict="deny",
        namespace="a-very-long-namespace-name-for-research",
        name="x" * 80,
        kind="PyTorchJob",
        rules=[
            ("training-same-rack", "deny"),
            ("training-elastic-shrink", "deny"),
            ("training-queue-priority", "warn"),
            ("training-topology-scheduler", "warn"),
        ],
    )
    with AuditLog(tmp_path / "audit.log") as log:
        for r in [*decisions(), long]:
            log.record(r)
    result = run(str(tmp_path))
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].split() == [
        "TIME",
        "(UTC)",
        "VERDICT",
        "KIND",
        "NAMESPACE/NAME",
        "WORKLOAD",
        "RULES",
        "LATENCY",
    ]
    assert len(lines) == 1 + 13 + 1  # header, rows, dry-run footnote
    assert all(len(line) <= 120 for line in lines)
    assert len(lines[-2]) == 120 and "…" in lines[-2]
    assert "  a-very-long-namespace-name" in lines[-2] and "  deny: training-same-rack" in lines[-2]
    assert lines[-2].count("…") == 2  # name and rules cut, each ending in an ellipsis
    row0 = lines[1]
    assert "deny" in row0 and "PyTorchJob" in row0 and "ml/bert" in row0 and row0.endswith("1.00ms")
    assert "deny*" in lines[6] and lines[-1].startswith("* dry run")
    # every column starts at the same offset on every row
    for column in ("VERDICT", "KIND", "NAMESPACE/NAME", "WORKLOAD", "RULES"):
        start = lines[0].index(column)
        assert all(line[start - 2 : start] == "  " and line[start] != " " for line in lines[1:-1]), column


@given(
    st.lists(
        st.fixed_dictionaries(
            {
                "kind": st.text(max_size=60),
                "namespace": st.text(max_size=60),
                "name": st.text(max_size=90),
                "workload": st.text(max_size=30),
                "latencyMs": st.floats(0, 1e6),
                "rules": st.lists(
                    st.fixed_dictionaries(
                        {"rule": st.text(max_size=40), "outcome": st.sampled_from(["deny", "warn", "pass"])}
                    )
                ),
            }
        ),
        min_size=1,
        max_size=5,
    ),
    st.integers(80, 200),
)
def test_table_lines_never_exceed_the_width(recs: list[dict[str, Any]], width: int) -> None:
    entries = [(datetime.now(UTC), {**r, "verdict": "deny"}) for r in recs]
    assert all(len(line) <= width for line in render_table(entries, width).splitlines())


# -- summary ---------------------------------------------------------------------------------------------


def test_summary_counts_excepted_rules_and_the_rule_filter_finds_them(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A GPUPolicyException's work is visible per rule: the object was let through (verdict warn, the
    exception's warning), the rule it would have failed is counted as excepted, not as a denial."""
    records = [
        decision(0, minutes_ago=3, verdict="warn", rules=[("training-elastic-shrink", "excepted")]),
        decision(1, minutes_ago=2, verdict="deny", rules=[("training-elastic-shrink", "deny")]),
        decision(2, minutes_ago=1),
    ]
    with AuditLog(tmp_path / "audit.log") as log:
        for r in records:
            log.record(r)
    assert main(["audit", str(tmp_path), "--summary", "-o", "json"]) == 0
    s = orjson.loads(capsys.readouterr().out)
    assert s["byRule"]["training-elastic-shrink"] == {"deny": 1, "warn": 0, "audit": 0, "error": 0, "excepted": 1}
    assert main(["audit", str(tmp_path), "--summary"]) == 0
    text = capsys.readouterr().out
    header = next(line for line in text.splitlines() if line.strip().startswith("RULE"))
    row = next(line for line in text.splitlines() if line.strip().startswith("training-elastic-shrink"))
    assert header.split() == ["RULE", "DENY", "WARN", "AUDIT", "ERROR", "EXCEPTED"]
    assert row.split() == ["training-elastic-shrink", "1", "0", "0", "0", "1"]
    assert uids(capsys, str(tmp_path), "--rule", "training-elastic-shrink") == ids(0, 1)


def outcome(i: int, group: str, rules: list[str], *, minutes_ago: float, ratio: float = 1.0) -> dict[str, Any]:
    """A follow-up record as webhook.ledger.follow_up writes it (the fields the summary reads)."""
    return {
        "time": format_time(time.time() - minutes_ago * 60),
        "uid": f"job-{i}",
        "admissionUid": None if not rules else f"uid-{i}",
        "record": "outcome",
        "namespace": group.split("/", 1)[0],
        "group": group,
        "outcome": "one-domain",
        "rules": rules,
        "commRatio": ratio,
    }


def test_summary_joins_follow_ups_of_the_other_replica_to_its_decisions_by_group(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Two replicas: A admitted job `train` (training-node-pack applied), B is the elected ledger and wrote
    the follow-up with no rules; read together, the outcome counts under A's rules. The decision kept is the
    ledger's (the first that allowed, unless a later one denied); a group no log decided stays `(none)`."""
    group = "ml/batch.kubernetes.io/job-name=train"
    a = [
        {**decision(0, minutes_ago=9, rules=[("training-queue-priority", "warn")]), "group": group},
        {**decision(1, minutes_ago=8), "group": group, "mutations": ["training-node-pack"]},
        {**decision(2, minutes_ago=7, dry_run=True, verdict="deny", rules=[("gpu-request-fits", "deny")]),
         "group": group},
    ]  # fmt: skip
    b = [outcome(3, group, [], minutes_ago=1, ratio=1.5), outcome(4, "ml/Job/other", [], minutes_ago=1)]
    for name, records in (("a.log", a), ("b.log", b)):
        with AuditLog(tmp_path / name) as log:
            for r in records:
                log.record(r)
    assert main(["audit", str(tmp_path / "b.log"), str(tmp_path / "a.log"), "--summary", "-o", "json"]) == 0
    by_rule = orjson.loads(capsys.readouterr().out)["outcomes"]["byRule"]
    assert set(by_rule) == {"training-queue-priority", "(none)"}
    assert (
        by_rule["training-queue-priority"]["jobs"] == 1 and by_rule["training-queue-priority"]["commRatioMean"] == 1.5
    )
    assert by_rule["(none)"]["jobs"] == 1
    assert main(["audit", str(tmp_path / "b.log"), "--summary", "-o", "json"]) == 0  # B's log alone: no join
    assert set(orjson.loads(capsys.readouterr().out)["outcomes"]["byRule"]) == {"(none)"}


def test_summary_json(logdir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["audit", str(logdir), "--summary", "-o", "json"]) == 0
    s = orjson.loads(capsys.readouterr().out)
    assert s["records"] == 12 and s["dryRun"] == 1
    assert s["verdicts"] == {"allow": 5, "warn": 2, "deny": 5}
    assert s["byRule"]["training-same-rack"] == {"deny": 3, "warn": 0, "audit": 0, "error": 0, "excepted": 0}
    assert s["byRule"]["training-queue-priority"] == {"deny": 0, "warn": 3, "audit": 0, "error": 0, "excepted": 0}
    assert s["byRule"]["gpu-request-fits"]["audit"] == 1
    assert next(iter(s["byRule"])) == "training-same-rack"  # most denials first
    assert s["byNamespace"] == {
        "ml": {"allow": 2, "warn": 1, "deny": 4},
        "serving": {"allow": 1, "warn": 1, "deny": 1},
        "ci": {"allow": 2, "warn": 0, "deny": 0},
    }
    assert sum(b["allow"] + b["warn"] + b["deny"] for b in s["buckets"]) == 12
    assert 3 <= len(s["buckets"]) <= 4 and s["bucketSeconds"] == 3600
    assert s["topDenied"][0] == {"namespace": "ml", "kind": "PyTorchJob", "name": "bert", "count": 3}
    assert {"namespace": "serving", "kind": "Deployment", "name": "llama", "count": 1} in s["topDenied"]
    lat = s["latencyMs"]
    assert (lat["count"], lat["p50"], lat["p90"], lat["p99"], lat["max"]) == (12, 6.0, 11.0, 100.0, 100.0)
    assert sum(b["count"] for b in lat["histogram"]) == 12
    assert lat["histogram"][0] == {"gt": 0.5, "le": 1.0, "count": 1}
    assert lat["histogram"][-1] == {"gt": 50.0, "le": 100.0, "count": 1}


def test_summary_text(logdir: Path) -> None:
    result = run(str(logdir), "--summary", "--bucket", "30m")
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert out.startswith("12 records from ")
    assert "allow 5, warn 2, deny 5 (1 dry run)" in out.splitlines()[0]
    for heading in ("By rule", "By namespace", "Verdicts per 30m", "Top denied workloads", "Latency (ms)"):
        assert f"\n{heading}" in out
    assert "  ml/PyTorchJob/bert" in out and "p50 6.00  p90 11.00  p99 100.00  max 100.00  (n=12)" in out
    rule_line = next(line for line in out.splitlines() if line.strip().startswith("training-same-rack"))
    assert rule_line.split() == ["training-same-rack", "3", "0", "0", "0", "0"]
    assert "50-100" in out and "#" in out


def test_summary_buckets_include_empty_ones() -> None:
    summary = Summary(parse_duration("1h", "--bucket"))
    for hour in (0, 3):
        summary.add((datetime(2026, 11, 30, hour, 10, tzinfo=UTC), {"verdict": "allow"}))
    assert [b["allow"] for b in summary.to_json()["buckets"]] == [1, 0, 0, 1]


# -- errors ----------------------------------------------------------------------------------------------


def test_missing_file_is_one_line_exit_2(tmp_path: Path) -> None:
    result = run(str(tmp_path / "nope.log"))
    assert result.returncode == 2
    assert result.stderr == f"gpu-admission: error: cannot read {tmp_path / 'nope.log'}: No such file or directory\n"


def test_unreadable_and_corrupt_inputs_exit_2(tmp_path: Path) -> None:
    corrupt = tmp_path / "audit.log.1.gz"
    corrupt.write_bytes(gzip.compress(b"".join(orjson.dumps(r) + b"\n" for r in decisions()))[:-30])
    for args, message in [
        ([str(corrupt)], "cannot read"),
        ([str(tmp_path / "*.nothing")], "no files match"),
        ([str(tmp_path), "--since", "yesterday"], "--since: not a duration"),
        ([str(tmp_path), "--bucket", "0h"], "--bucket"),
    ]:
        result = run(*args)
        assert result.returncode == 2, args
        assert len(result.stderr.splitlines()) == 1 and message in result.stderr, result.stderr
        assert "Traceback" not in result.stderr


def test_parse_duration() -> None:
    assert parse_duration("15m", "x").total_seconds() == 900
    assert parse_duration("1h30m", "x").total_seconds() == 5400
    assert parse_duration("1d", "x").total_seconds() == 86400
    for bad in ("", "15", "m", "1x", "-1h", "1h 2m"):
        with pytest.raises(UsageError):
            parse_duration(bad, "--since")


def test_the_unfinished_last_line_of_a_live_log_is_left_out_not_skipped(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Read while the server writes: the last line may be half written (no newline yet). That is no malformed
    line, and is said as such; a complete line that is no record is still counted as skipped, and a last line
    with no newline that is a whole record is read."""
    path = tmp_path / "audit.log"
    whole = [orjson.dumps(r) + b"\n" for r in decisions()[:3]]
    path.write_bytes(b"".join(whole) + orjson.dumps(decisions()[3])[:50])
    assert query(capsys, str(path)) == (
        ids(0, 1, 2),
        "gpu-admission audit: left out the unfinished last line of 1 input(s) (still being written)\n",
    )
    path.write_bytes(b"".join(whole) + b"not json\n" + orjson.dumps(decisions()[3]))  # complete, no newline
    assert query(capsys, str(path)) == (
        ids(0, 1, 2, 3),
        "gpu-admission audit: skipped 1 line(s) that are not audit records\n",
    )
