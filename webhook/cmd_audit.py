"""`gpu-admission audit`: read, filter and summarise audit logs.

Inputs are audit files (current, rotated, gzipped — detected by content, not by name), directories and globs
of them, and `-` for stdin (e.g. `kubectl logs` output). Lines that are not audit records are skipped and
counted; a `kubectl logs --prefix` / `--timestamps` prefix before the JSON is ignored.
"""

from __future__ import annotations

import argparse
import bisect
import glob
import gzip
import math
import re
import shutil
import sys
import zlib
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import IO, Any

import orjson

from policies.ledger import BOUND_OUTCOMES, OUTCOMES, Admission, merge_admission
from policies.limits import json_too_deep
from webhook.audit import ROTATED_SUFFIX, format_time, is_stale, parse_time
from webhook.cli import UsageError

# A record is a few KiB (its patch is the largest part); a longer line is not one of ours.
MAX_LINE = 4 * 2**20

VERDICTS = ("allow", "warn", "deny")
# Rule outcomes that count as the rule firing. "excepted": the rule would have fired and a GPUPolicyException
# let the object through; counted per rule so an operator sees how much each exception carries.
FIRED = ("deny", "warn", "audit", "error", "excepted")
LEDGER_FIRED = FIRED[:4]  # what the ledger keeps of a decision as fired (webhook/app.py `_admission`)
STDIN = "-"

_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)([smhdw])")
_UNIT_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
# Upper bounds (ms) of the latency histogram's bins; the last bin is open.
_LATENCY_BINS = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 25.0, 50.0, 100.0, 250.0, 500.0, 1000.0, 2500.0)
_MAX_LISTED_BUCKETS = 200

Entry = tuple[datetime, dict[str, Any]]


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "audit",
        help="read, filter and summarise audit logs",
        description="Read audit logs (files, rotated and gzipped files, directories, globs, or - for stdin "
        "such as `kubectl logs` output), filter them and print a table, JSON or a summary.",
    )
    p.add_argument("files", nargs="*", metavar="FILE|DIR|GLOB|-", help="audit logs to read (default: stdin if piped)")
    p.add_argument("--since", metavar="DURATION", help="only records newer than this, e.g. 15m, 2h, 1d")
    p.add_argument("--namespace", "-n", metavar="NS", help="only this namespace")
    p.add_argument(
        "--rule", metavar="ID", help="only records where this rule denied, warned, audited, erred or was excepted"
    )
    p.add_argument("--verdict", choices=VERDICTS, help="only this verdict")
    p.add_argument("--user", metavar="U", help="only requests by this user")
    p.add_argument("--kind", metavar="K", help="only this kind (case-insensitive)")
    p.add_argument(
        "--dry-run",
        choices=("only", "exclude", "include"),
        default="include",
        help="dry-run requests: only them, without them, or with them (default)",
    )
    p.add_argument("-o", "--output", choices=("table", "json"), default="table", help="output format")
    p.add_argument("--summary", action="store_true", help="print counts and latency instead of records")
    p.add_argument("--bucket", metavar="DURATION", default="1h", help="time bucket of the summary (default 1h)")
    p.set_defaults(func=run)


def parse_duration(text: str, flag: str) -> timedelta:
    """`15m`, `2h`, `1d`, `1h30m`, `90s`, `1w` → timedelta; UsageError otherwise."""
    compact = text.strip().lower()
    parts = _DURATION_PART.findall(compact)
    if not parts or "".join(n + u for n, u in parts) != compact:
        raise UsageError(f"{flag}: not a duration: {text!r} (use e.g. 30s, 15m, 2h, 1d)")
    seconds = sum(float(n) * _UNIT_SECONDS[u] for n, u in parts)
    if seconds <= 0:
        raise UsageError(f"{flag}: the duration must be more than zero")
    return timedelta(seconds=seconds)


# -- reading ---------------------------------------------------------------------------------------------


class Reader:
    """Turns inputs into audit records, counting what it skips."""

    def __init__(self) -> None:
        self.records = 0
        self.skipped = 0
        self.unfinished = 0  # last lines with no newline that are no record: a log still being written
        self.inputs = 0

    def read(self, sources: list[str]) -> Iterator[Entry]:
        for source in sources:
            self.inputs += 1
            if source == STDIN:
                yield from self._lines(STDIN, sys.stdin.buffer)
                continue
            try:
                stream = open(source, "rb")  # noqa: SIM115 (closed below, after the generator is done)
            except OSError as exc:
                raise UsageError(f"cannot read {source}: {exc.strerror or exc}") from None
            with stream:
                yield from self._lines(source, stream)

    def _lines(self, name: str, raw: IO[bytes]) -> Iterator[Entry]:
        try:
            stream: IO[bytes] | gzip.GzipFile = gzip.GzipFile(fileobj=raw) if _is_gzip(raw) else raw
            for line in _bounded_lines(stream):
                # Only a stream's last line can lack its newline: the writer may be halfway through it.
                entry = self._parse(line, unfinished=not line.endswith(b"\n"))
                if entry is not None:
                    yield entry
        except (OSError, EOFError, zlib.error) as exc:
            reason = getattr(exc, "strerror", None) or str(exc) or type(exc).__name__
            raise UsageError(f"cannot read {name}: {reason}") from None

    def _parse(self, line: bytes, unfinished: bool = False) -> Entry | None:
        line = line.strip()
        if not line:
            return None
        start = line.find(b"{")  # past a `kubectl logs --prefix/--timestamps` prefix
        try:
            rec = orjson.loads(line[start:]) if start >= 0 else None
        except orjson.JSONDecodeError:
            rec = None
        if json_too_deep(rec):
            rec = None  # not a record this program wrote (they nest ~10 levels); skipped like any other
        entry = _as_entry(rec)
        if entry is None and unfinished:
            self.unfinished += 1
        elif entry is None:
            self.skipped += 1
        else:
            self.records += 1
        return entry


def _bounded_lines(stream: IO[bytes] | gzip.GzipFile) -> Iterator[bytes]:
    """The lines of a stream, each at most MAX_LINE bytes in memory: the rest of a longer line (not a record
    this program wrote) is read past in MAX_LINE pieces and counted as one skipped line."""
    while True:
        line = stream.readline(MAX_LINE + 1)
        if not line:
            return
        if len(line) > MAX_LINE and not line.endswith(b"\n"):
            while (rest := stream.readline(MAX_LINE)) and not rest.endswith(b"\n"):
                pass
            yield b"{\n"  # counted as a skipped line
            continue
        yield line


def _is_gzip(stream: IO[bytes]) -> bool:
    peek = getattr(stream, "peek", None)
    if peek is not None:
        return bytes(peek(2)[:2]) == b"\x1f\x8b"
    magic = stream.read(2)
    stream.seek(0)
    return magic == b"\x1f\x8b"


def is_outcome(rec: dict[str, Any]) -> bool:
    """A follow-up record of the ledger: what became of an admitted job (docs/audit.md)."""
    return rec.get("record") == "outcome"


def _as_entry(rec: object) -> Entry | None:
    """An audit record has at least a parseable `time`, a `uid` and a known `verdict` (a decision) or
    `outcome` (a follow-up record of the ledger)."""
    if not isinstance(rec, dict) or "uid" not in rec:
        return None
    if rec.get("verdict") not in VERDICTS and not (is_outcome(rec) and rec.get("outcome") in OUTCOMES):
        return None
    when = rec.get("time")
    if not isinstance(when, str):
        return None
    try:
        return parse_time(when), rec
    except ValueError:
        return None


def expand(args: list[str]) -> list[str]:
    """Files to read: directories give their files, globs their matches; `-` is stdin (read once).
    Files a killed rotation left behind (see `webhook.audit.is_stale`) are left out of directories/globs."""
    out: list[str] = []
    seen: set[str] = set()

    def add(path: str) -> None:
        key = path if path == STDIN else str(Path(path).resolve())
        if key not in seen:
            seen.add(key)
            out.append(path)

    for arg in args:
        if arg == STDIN or Path(arg).is_file():
            add(arg)
            continue
        if Path(arg).is_dir():
            found = [p for p in Path(arg).iterdir() if p.is_file() and not p.name.startswith(".")]
        elif any(c in arg for c in "*?["):
            found = [Path(p) for p in glob.glob(arg) if Path(p).is_file()]
            if not found:
                raise UsageError(f"no files match {arg}")
        else:
            add(arg)  # reading it reports why it cannot be read
            continue
        for p in sorted((p for p in found if not is_stale(p)), key=_age_order):
            add(str(p))
    return out


def _age_order(p: Path) -> tuple[str, int]:
    """`audit.log.3.gz`, `audit.log.2`, `audit.log.1`, `audit.log`: oldest first within one log."""
    match = ROTATED_SUFFIX.search(p.name)
    if match is None:
        return (str(p), 0)
    return (str(p)[: len(str(p)) - len(match.group(0))], -int(match.group(1)))


# -- filtering -------------------------------------------------------------------------------------------


def fired(rec: dict[str, Any]) -> list[tuple[str, str]]:
    """(rule, outcome) of each rule that denied, warned, audited or erred."""
    rules = rec.get("rules")
    if not isinstance(rules, list) or is_outcome(rec):
        return []
    out = []
    for r in rules:
        if isinstance(r, dict) and isinstance(r.get("rule"), str) and r.get("outcome") in FIRED:
            out.append((r["rule"], r["outcome"]))
    return out


def _rule_ids(rec: dict[str, Any]) -> list[str]:
    """The rules a record is about: those that fired, or for an outcome those that fired at admission."""
    if is_outcome(rec):
        rules = rec.get("rules")
        return [r for r in rules if isinstance(r, str)] if isinstance(rules, list) else []
    return [rule for rule, _ in fired(rec)]


def make_filter(args: argparse.Namespace, now: datetime) -> Callable[[Entry], bool]:
    since = now - parse_duration(args.since, "--since") if args.since else None
    kind = args.kind.lower() if args.kind else None

    def keep(entry: Entry) -> bool:
        when, rec = entry
        dry = rec.get("dryRun") is True
        return (
            (since is None or when >= since)
            and (args.namespace is None or rec.get("namespace") == args.namespace)
            and (args.verdict is None or rec.get("verdict") == args.verdict)
            and (args.user is None or rec.get("user") == args.user)
            and (kind is None or str(rec.get("kind", "")).lower() == kind)
            and (args.dry_run == "include" or dry == (args.dry_run == "only"))
            and (args.rule is None or any(rule == args.rule for rule in _rule_ids(rec)))
        )

    return keep


# -- the command -----------------------------------------------------------------------------------------


def run(args: argparse.Namespace) -> int:
    files: list[str] = args.files
    if not files:
        if sys.stdin.isatty():
            raise UsageError("no input: give audit log files, a directory, a glob, or - for stdin")
        files = [STDIN]
    now = datetime.now(UTC)
    keep = make_filter(args, now)
    bucket = parse_duration(args.bucket, "--bucket")
    reader = Reader()
    entries = (e for e in reader.read(expand(files)) if keep(e))

    summary: Summary | None = None
    matched: list[Entry] = []
    if args.summary:
        summary = Summary(bucket)
        for entry in entries:
            summary.add(entry)
    else:
        matched = sorted(entries, key=lambda e: e[0])

    if reader.skipped:
        print(
            f"gpu-admission audit: skipped {reader.skipped} line(s) that are not audit records",
            file=sys.stderr,
        )
    if reader.unfinished:
        print(
            f"gpu-admission audit: left out the unfinished last line of {reader.unfinished} input(s) "
            "(still being written)",
            file=sys.stderr,
        )
    count = summary.count if summary is not None else len(matched)
    if count == 0:
        found = f"{reader.records} audit record(s) in {reader.inputs} input(s)"
        print(f"gpu-admission audit: no audit records matched ({found})", file=sys.stderr)
    out = sys.stdout
    if args.output == "json":
        doc: object = summary.to_json() if summary is not None else [rec for _, rec in matched]
        out.write(orjson.dumps(doc, option=orjson.OPT_INDENT_2).decode() + "\n")
    elif count and summary is not None:
        out.write(summary.render())
    elif count:
        out.write(render_table(matched, shutil.get_terminal_size((120, 24)).columns))
    return 0


# -- table -----------------------------------------------------------------------------------------------

_HEADERS = ("TIME (UTC)", "VERDICT", "KIND", "NAMESPACE/NAME", "WORKLOAD", "RULES", "LATENCY")
_MIN_WIDTH = (19, 7, 4, 12, 5, 8, 7)  # columns shrink down to these, the widest first (fits 80 columns)
_MAX_WIDTH = (19, 7, 16, 48, 12, 200, 10)


def _cell(value: object) -> str:
    """Text for one cell: never a line break or other control character, whatever the record holds."""
    text = "" if value is None else str(value)
    return text if text.isprintable() else "".join(c if c.isprintable() else " " for c in text)


def _rules_cell(rec: dict[str, Any]) -> str:
    by_outcome: dict[str, list[str]] = {}
    for rule, outcome in fired(rec):
        if outcome != "audit":
            by_outcome.setdefault(outcome, []).append(rule)
    return _cell("; ".join(f"{o}: {', '.join(rules)}" for o, rules in by_outcome.items()) or "-")


def _latency_cell(rec: dict[str, Any]) -> str:
    value = rec.get("latencyMs")
    return f"{value:.2f}ms" if isinstance(value, int | float) else "-"


def _row(entry: Entry) -> list[str]:
    when, rec = entry
    if is_outcome(rec):
        pending = rec.get("pendingSeconds")
        return [
            f"{when:%Y-%m-%d %H:%M:%S}",
            _cell(rec.get("outcome")),
            "(ledger)",
            _cell(rec.get("group")),
            _cell(rec.get("workload")) or "-",
            _cell(", ".join(_rule_ids(rec))) or "-",
            f"{pending:.0f}s" if isinstance(pending, int | float) else "-",
        ]
    namespace, name = _cell(rec.get("namespace")), _cell(rec.get("name")) or "<generated>"
    return [
        f"{when:%Y-%m-%d %H:%M:%S}",
        _cell(rec.get("verdict")) + ("*" if rec.get("dryRun") is True else ""),
        _cell(rec.get("kind")),
        f"{namespace}/{name}" if namespace else name,
        _cell(rec.get("workload")) or "-",
        _rules_cell(rec),
        _latency_cell(rec),
    ]


def _fit(cell: str, width: int) -> str:
    return cell if len(cell) <= width else cell[: width - 1] + "…"


def render_table(entries: list[Entry], columns: int) -> str:
    """Aligned columns within `columns` characters; long cells end in an ellipsis."""
    rows = [_row(e) for e in entries]
    widths = [
        min(cap, max(len(h), *(len(r[i]) for r in rows)))
        for i, (h, cap) in enumerate(zip(_HEADERS, _MAX_WIDTH, strict=True))
    ]
    room = columns - 2 * (len(widths) - 1)
    while sum(widths) > room:
        shrinkable = [i for i, w in enumerate(widths) if w > _MIN_WIDTH[i]]
        if not shrinkable:
            break
        widest = max(shrinkable, key=lambda i: widths[i] - _MIN_WIDTH[i])
        widths[widest] -= 1
    lines = []
    for row in [list(_HEADERS), *rows]:
        cells = [_fit(c, w).ljust(w) for c, w in zip(row[:-1], widths, strict=False)]
        cells.append(_fit(row[-1], widths[-1]).rjust(widths[-1]))
        lines.append("  ".join(cells))
    if any(e[1].get("dryRun") is True for e in entries):
        lines.append("* dry run (not persisted)")
    return "\n".join(lines) + "\n"


# -- summary ---------------------------------------------------------------------------------------------


class Summary:
    """Counts by rule, namespace, verdict and time bucket; top denied workloads; latency distribution."""

    def __init__(self, bucket: timedelta) -> None:
        self.bucket = bucket.total_seconds()
        self.count = 0
        self.dry_run = 0
        self.first: datetime | None = None
        self.last: datetime | None = None
        self.verdicts: Counter[str] = Counter()
        self.by_rule: dict[str, Counter[str]] = {}
        self.by_namespace: dict[str, Counter[str]] = {}
        self.buckets: dict[float, Counter[str]] = {}
        self.denied: Counter[tuple[str, str, str]] = Counter()
        self.latencies: list[float] = []
        self.outcomes = Outcomes()

    def add(self, entry: Entry) -> None:
        when, rec = entry
        if is_outcome(rec):
            self.count += 1
            self.first = when if self.first is None else min(self.first, when)
            self.last = when if self.last is None else max(self.last, when)
            self.outcomes.add(rec)
            return
        verdict = rec["verdict"]
        self.outcomes.decided(when, rec)
        self.count += 1
        self.dry_run += rec.get("dryRun") is True
        self.first = when if self.first is None else min(self.first, when)
        self.last = when if self.last is None else max(self.last, when)
        self.verdicts[verdict] += 1
        for rule, outcome in fired(rec):
            self.by_rule.setdefault(rule, Counter())[outcome] += 1
        namespace = _cell(rec.get("namespace")) or "(cluster)"
        self.by_namespace.setdefault(namespace, Counter())[verdict] += 1
        start = math.floor(when.timestamp() / self.bucket) * self.bucket
        self.buckets.setdefault(start, Counter())[verdict] += 1
        if verdict == "deny":
            name = _cell(rec.get("name")) or "<generated>"
            self.denied[(namespace, _cell(rec.get("kind")), name)] += 1
        latency = rec.get("latencyMs")
        if isinstance(latency, int | float) and not isinstance(latency, bool):
            self.latencies.append(float(latency))

    # derived views, shared by JSON and text

    def _rules(self) -> list[tuple[str, Counter[str]]]:
        return sorted(self.by_rule.items(), key=lambda kv: (-kv[1]["deny"], -kv[1]["warn"], kv[0]))

    def _namespaces(self) -> list[tuple[str, Counter[str]]]:
        return sorted(self.by_namespace.items(), key=lambda kv: (-kv[1].total(), kv[0]))

    def _bucket_rows(self) -> tuple[list[tuple[float, Counter[str]]], bool]:
        """Every bucket from first to last, or only the non-empty ones when there would be too many."""
        starts = sorted(self.buckets)
        if not starts:
            return [], False
        span = round((starts[-1] - starts[0]) / self.bucket) + 1
        if span > _MAX_LISTED_BUCKETS:
            return [(s, self.buckets[s]) for s in starts], True
        every = (starts[0] + i * self.bucket for i in range(span))
        return [(s, self.buckets.get(s, Counter())) for s in every], False

    def _latency(self) -> dict[str, Any]:
        values = sorted(self.latencies)
        if not values:
            return {"count": 0}

        def pct(q: float) -> float:
            return values[max(0, math.ceil(q * len(values)) - 1)]

        counts = [0] * (len(_LATENCY_BINS) + 1)
        for v in values:
            counts[bisect.bisect_left(_LATENCY_BINS, v)] += 1
        used = [i for i, c in enumerate(counts) if c]
        bounds = (0.0, *_LATENCY_BINS, None)
        bins = [{"gt": bounds[i], "le": bounds[i + 1], "count": counts[i]} for i in range(used[0], used[-1] + 1)]
        return {
            "count": len(values),
            "p50": pct(0.50),
            "p90": pct(0.90),
            "p99": pct(0.99),
            "max": values[-1],
            "histogram": bins,
        }

    def to_json(self) -> dict[str, Any]:
        self.outcomes.resolve()
        buckets, _ = self._bucket_rows()
        return {
            "records": self.count,
            "from": format_time(self.first.timestamp()) if self.first else None,
            "to": format_time(self.last.timestamp()) if self.last else None,
            "verdicts": {v: self.verdicts[v] for v in VERDICTS},
            "dryRun": self.dry_run,
            "byRule": {rule: {o: c[o] for o in FIRED} for rule, c in self._rules()},
            "byNamespace": {ns: {v: c[v] for v in VERDICTS} for ns, c in self._namespaces()},
            "bucketSeconds": int(self.bucket) if self.bucket.is_integer() else self.bucket,
            "buckets": [{"start": format_time(start), **{v: c[v] for v in VERDICTS}} for start, c in buckets],
            "topDenied": [
                {"namespace": ns, "kind": kind, "name": name, "count": n} for (ns, kind, name), n in self._top_denied()
            ],
            "latencyMs": self._latency(),
            "outcomes": self.outcomes.to_json(),
        }

    def _top_denied(self) -> list[tuple[tuple[str, str, str], int]]:
        return sorted(self.denied.items(), key=lambda kv: (-kv[1], kv[0]))[:10]

    def render(self) -> str:
        self.outcomes.resolve()
        out: list[str] = []
        first, last = self.first, self.last
        assert first is not None and last is not None
        verdicts = ", ".join(f"{v} {self.verdicts[v]}" for v in VERDICTS)
        out.append(
            f"{self.count} records from {first:%Y-%m-%d %H:%M:%S} to {last:%Y-%m-%d %H:%M:%S} UTC: "
            f"{verdicts} ({self.dry_run} dry run)"
            + (f"; {self.outcomes.jobs} outcome(s)" if self.outcomes.jobs else "")
        )

        rules = self._rules()
        out += ["", "By rule"]
        if rules:
            out += _columns(
                ["RULE", "DENY", "WARN", "AUDIT", "ERROR", "EXCEPTED"],
                [[rule, *(str(c[o]) for o in FIRED)] for rule, c in rules],
            )
        else:
            out.append("  no rule denied, warned or audited")

        out += ["", "By namespace"]
        out += _columns(
            ["NAMESPACE", "ALLOW", "WARN", "DENY", "TOTAL"],
            [[ns, *(str(c[v]) for v in VERDICTS), str(c.total())] for ns, c in self._namespaces()],
        )

        buckets, sparse = self._bucket_rows()
        out += [
            "",
            f"Verdicts per {_duration_text(self.bucket)}" + (" (empty buckets left out)" if sparse else ""),
        ]
        peak = max((c.total() for _, c in buckets), default=0)
        out += _columns(
            ["START (UTC)", "ALLOW", "WARN", "DENY", ""],
            [
                [
                    f"{datetime.fromtimestamp(start, UTC):%Y-%m-%d %H:%M:%S}",
                    *(str(c[v]) for v in VERDICTS),
                    _bar(c.total(), peak, 30),
                ]
                for start, c in buckets
            ],
        )

        out += ["", "Top denied workloads"]
        top = self._top_denied()
        if top:
            out += _columns(["NAMESPACE/KIND/NAME", "DENIED"], [["/".join(k), str(n)] for k, n in top])
        else:
            out.append("  none")

        latency = self._latency()
        out += ["", "Latency (ms)"]
        if latency["count"]:
            out.append(
                "  "
                + "  ".join(f"{k} {latency[k]:.2f}" for k in ("p50", "p90", "p99", "max"))
                + f"  (n={latency['count']})"
            )
            peak = max(b["count"] for b in latency["histogram"])
            rows = [
                [_bin_label(b["gt"], b["le"]), str(b["count"]), _bar(b["count"], peak, 40)]
                for b in latency["histogram"]
            ]
            out += _columns(["", "COUNT", ""], rows)
        else:
            out.append("  no latencies recorded")
        out += self.outcomes.render()
        return "\n".join(out) + "\n"


class Outcomes:
    """The ledger's follow-up records: per rule and per namespace, jobs, how many were fully bound (within the
    server's --ledger-window: a job not bound by then is final as partly or never bound), and the mean comm
    ratio (actual placement's all-reduce time over the best the free GPUs allowed at admission)."""

    def __init__(self) -> None:
        self.jobs = 0
        self.by_outcome: Counter[str] = Counter()
        self.by_rule: dict[str, list[float]] = {}  # [jobs, denied, bound, ratio sum, ratios]
        self.by_namespace: dict[str, list[float]] = {}
        self._unjoined: list[tuple[str, str, float | None]] = []  # (group, outcome, comm ratio)
        self._decisions: dict[str, list[tuple[datetime, str, tuple[str, ...]]]] = {}

    def add(self, rec: dict[str, Any]) -> None:
        outcome = str(rec["outcome"])
        ratio = rec.get("commRatio")
        ratio = float(ratio) if isinstance(ratio, int | float) and not isinstance(ratio, bool) else None
        self.jobs += 1
        self.by_outcome[outcome] += 1
        rules = _rule_ids(rec)
        group = rec.get("group")
        if not rules and isinstance(group, str) and group:
            # Written by the elected replica for a job the other replica admitted: its rules are in that
            # replica's decision records, joined by group once every log is read (`resolve`).
            self._unjoined.append((group, outcome, ratio))
        else:
            self._tally_rules(rules, outcome, ratio)
        _tally(self.by_namespace.setdefault(_cell(rec.get("namespace")) or "(cluster)", [0.0] * 5), outcome, ratio)

    def decided(self, when: datetime, rec: dict[str, Any]) -> None:
        """A decision record: kept per group, for the follow-ups that name no rules."""
        group = rec.get("group")
        if isinstance(group, str) and group and not rec.get("dryRun"):
            self._decisions.setdefault(group, []).append((when, str(rec["verdict"]), _ledger_rules(rec)))

    def resolve(self) -> None:
        """Count the follow-ups without rules under the rules of the decision the ledger keeps for their group
        (policies.ledger.merge_admission over the group's decisions in time order); `(none)` when no log read
        has a decision of that group."""
        for group, outcome, ratio in self._unjoined:
            self._tally_rules(_kept_rules(self._decisions.get(group, [])), outcome, ratio)
        self._unjoined.clear()

    def _tally_rules(self, rules: list[str], outcome: str, ratio: float | None) -> None:
        for rule in rules or ["(none)"]:
            _tally(self.by_rule.setdefault(rule, [0.0] * 5), outcome, ratio)

    def to_json(self) -> dict[str, Any]:
        return {
            "jobs": self.jobs,
            "byOutcome": {o: self.by_outcome[o] for o in OUTCOMES},
            "byRule": {k: _stats(v) for k, v in sorted(self.by_rule.items())},
            "byNamespace": {k: _stats(v) for k, v in sorted(self.by_namespace.items())},
        }

    def render(self) -> list[str]:
        if not self.jobs:
            return []
        out = ["", f"Placement outcomes ({self.jobs} jobs)"]
        out.append("  " + ", ".join(f"{o} {self.by_outcome[o]}" for o in OUTCOMES))
        for title, table in (("RULE", self.by_rule), ("NAMESPACE", self.by_namespace)):
            rows = []
            for key, acc in sorted(table.items()):
                st = _stats(acc)
                rate = "-" if st["successRate"] is None else f"{st['successRate']:.0%}"
                ratio = "-" if st["commRatioMean"] is None else f"{st['commRatioMean']:.2f}"
                rows.append([key, str(st["jobs"]), str(st["denied"]), str(st["bound"]), rate, ratio])
            out += ["", *_columns([title, "JOBS", "DENIED", "BOUND", "SUCCESS", "COMM×"], rows)]
        return out


def _ledger_rules(rec: dict[str, Any]) -> tuple[str, ...]:
    """What the ledger keeps of a decision's rules (webhook/app.py `_admission`): the rules that fired, then
    the mutations applied."""
    rules, mutations = rec.get("rules"), rec.get("mutations")
    named: list[Any] = []
    if isinstance(rules, list):
        named += [r.get("rule") for r in rules if isinstance(r, dict) and r.get("outcome") in LEDGER_FIRED]
    if isinstance(mutations, list):
        named += mutations
    return tuple(dict.fromkeys(x for x in named if isinstance(x, str)))


def _kept_rules(decisions: list[tuple[datetime, str, tuple[str, ...]]]) -> list[str]:
    kept: Admission | None = None
    for when, verdict, rules in sorted(decisions, key=lambda d: d[0]):
        kept = merge_admission(kept, Admission("", when.timestamp(), verdict, rules, ""))
    return list(kept.rules) if kept is not None else []


def _tally(acc: list[float], outcome: str, ratio: float | None) -> None:
    acc[0] += 1
    acc[1] += outcome == "denied"
    acc[2] += outcome in BOUND_OUTCOMES
    if ratio is not None:
        acc[3] += ratio
        acc[4] += 1


def _stats(acc: list[float]) -> dict[str, Any]:
    jobs, denied, bound, total, n = (int(acc[0]), int(acc[1]), int(acc[2]), acc[3], int(acc[4]))
    admitted = jobs - denied
    return {
        "jobs": jobs,
        "denied": denied,
        "bound": bound,
        "successRate": bound / admitted if admitted else None,
        "commRatioMean": total / n if n else None,
    }


def _columns(headers: list[str], rows: Iterable[list[str]]) -> list[str]:
    """Indented columns: the first left-aligned, the rest right-aligned, a trailing bar left-aligned."""
    table = [headers, *rows]
    widths = [max(len(r[i]) for r in table) for i in range(len(headers))]
    lines = []
    for r in table:
        cells = [r[0].ljust(widths[0])]
        for i in range(1, len(r)):
            is_bar = headers[i] == "" and i == len(r) - 1
            cells.append(r[i] if is_bar else r[i].rjust(widths[i]))
        lines.append(("  " + "  ".join(cells)).rstrip())
    return lines


def _bin_label(gt: float, le: float | None) -> str:
    if le is None:
        return f"> {gt:g}"
    return f"<= {le:g}" if gt == 0 else f"{gt:g}-{le:g}"


def _bar(value: int, peak: int, width: int) -> str:
    if value == 0 or peak == 0:
        return ""
    return "#" * max(1, round(width * value / peak))


def _duration_text(seconds: float) -> str:
    for unit, size in (("w", 604800), ("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size and seconds % size == 0:
            return f"{int(seconds // size)}{unit}"
    return f"{seconds:g}s"
