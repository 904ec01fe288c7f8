"""Prometheus text exposition, hand-rolled: a few counters, gauges and one histogram, no dependency.

Label values come from a small closed set (webhook, verdict, rule ids), so cardinality stays bounded.
"""

from __future__ import annotations

import bisect
import threading
from collections.abc import Callable

BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)


def _num(value: float) -> str:
    """A sample value at full precision: `%g` would print 1234567 as 1.23457e+06, so a counter past a million
    would move in steps and rate() would lie; integers print as integers, other floats as repr (shortest
    round-trip form)."""
    if value.is_integer() and abs(value) < 2**53:
        return str(int(value))
    return repr(float(value))


Labels = tuple[tuple[str, str], ...]


def _labels(pairs: tuple[tuple[str, str], ...]) -> str:
    if not pairs:
        return ""
    inner = ",".join(f'{k}="{v.replace(chr(92), chr(92) * 2).replace(chr(34), chr(92) + chr(34))}"' for k, v in pairs)
    return "{" + inner + "}"


class Metrics:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counters: dict[str, dict[tuple[tuple[str, str], ...], float]] = {}
        self._help: dict[str, tuple[str, str]] = {}
        self._hist: dict[tuple[tuple[str, str], ...], list[float]] = {}
        self._hist_sum: dict[tuple[tuple[str, str], ...], float] = {}
        self._gauges: dict[str, Callable[[], list[tuple[tuple[tuple[str, str], ...], float]]]] = {}
        # Histograms other than the request duration: name -> (bounds, labels -> bucket counts, labels -> sum).
        self._named: dict[str, tuple[tuple[float, ...], dict[Labels, list[float]], dict[Labels, float]]] = {}
        self.describe("gpu_admission_requests_total", "counter", "Admission reviews answered, by webhook and verdict")
        self.describe("gpu_admission_rule_results_total", "counter", "Rule outcomes (deny, warn, audit, error)")
        self.describe("gpu_admission_mutations_total", "counter", "Mutations applied, by id")
        self.describe("gpu_admission_bad_requests_total", "counter", "Requests refused as malformed or overloaded")

    def describe(self, name: str, kind: str, text: str) -> None:
        self._help[name] = (kind, text)

    def inc(self, name: str, labels: tuple[tuple[str, str], ...] = (), value: float = 1.0) -> None:
        with self._lock:
            series = self._counters.setdefault(name, {})
            series[labels] = series.get(labels, 0.0) + value

    def observe(self, seconds: float, labels: tuple[tuple[str, str], ...]) -> None:
        with self._lock:
            counts = self._hist.setdefault(labels, [0.0] * (len(BUCKETS) + 1))
            counts[bisect.bisect_left(BUCKETS, seconds)] += 1
            self._hist_sum[labels] = self._hist_sum.get(labels, 0.0) + seconds

    def histogram(self, name: str, text: str, bounds: tuple[float, ...]) -> None:
        self._help[name] = ("histogram", text)
        self._named.setdefault(name, (bounds, {}, {}))

    def observe_in(self, name: str, value: float, labels: Labels) -> None:
        """One observation of a histogram declared with `histogram`."""
        bounds, counts, sums = self._named[name]
        with self._lock:
            row = counts.setdefault(labels, [0.0] * (len(bounds) + 1))
            row[bisect.bisect_left(bounds, value)] += 1
            sums[labels] = sums.get(labels, 0.0) + value

    def gauge(
        self,
        name: str,
        text: str,
        fn: Callable[[], list[tuple[tuple[tuple[str, str], ...], float]]],
        kind: str = "gauge",
    ) -> None:
        """A value read at scrape time; `kind="counter"` for a count kept elsewhere that only grows."""
        self._help[name] = (kind, text)
        self._gauges[name] = fn

    def render(self) -> str:
        lines: list[str] = []
        with self._lock:
            for name, series in sorted(self._counters.items()):
                kind, text = self._help.get(name, ("counter", name))
                lines += [f"# HELP {name} {text}", f"# TYPE {name} {kind}"]
                lines += [f"{name}{_labels(lab)} {_num(val)}" for lab, val in sorted(series.items())]
            if self._hist:
                name = "gpu_admission_request_duration_seconds"
                lines += [f"# HELP {name} Time to answer an admission review", f"# TYPE {name} histogram"]
                lines += _histogram_lines(name, BUCKETS, self._hist, self._hist_sum)
            for name, (bounds, counts, sums) in sorted(self._named.items()):
                lines += [f"# HELP {name} {self._help[name][1]}", f"# TYPE {name} histogram"]
                lines += _histogram_lines(name, bounds, counts, sums)
        for name, fn in sorted(self._gauges.items()):
            kind, text = self._help[name]
            lines += [f"# HELP {name} {text}", f"# TYPE {name} {kind}"]
            try:
                lines += [f"{name}{_labels(lab)} {_num(float(val))}" for lab, val in fn()]
            except Exception:  # a broken gauge must not break the scrape
                continue
        return "\n".join(lines) + "\n"


def _histogram_lines(
    name: str, bounds: tuple[float, ...], counts: dict[Labels, list[float]], sums: dict[Labels, float]
) -> list[str]:
    lines: list[str] = []
    for lab, row in sorted(counts.items()):
        cum = 0.0
        for bound, c in zip(bounds, row, strict=False):
            cum += c
            lines.append(f"{name}_bucket{_labels((*lab, ('le', f'{bound:g}')))} {_num(cum)}")
        cum += row[-1]
        lines.append(f"{name}_bucket{_labels((*lab, ('le', '+Inf')))} {_num(cum)}")
        lines.append(f"{name}_sum{_labels(lab)} {sums[lab]:.6f}")
        lines.append(f"{name}_count{_labels(lab)} {_num(cum)}")
    return lines
