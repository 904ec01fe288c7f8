"""The Prometheus text exposition of webhook/metrics.py: values at full precision, labels escaped."""

from __future__ import annotations

import pytest

from webhook.metrics import Metrics


def _sample(text: str, prefix: str) -> str:
    (line,) = [x for x in text.splitlines() if x.startswith(prefix)]
    return line[len(prefix) :].strip()


@pytest.mark.parametrize(
    ("value", "rendered"),
    [
        (0.0, "0"),
        (1.0, "1"),
        (999_999.0, "999999"),
        (1_234_567.0, "1234567"),  # %g would say 1.23457e+06: a counter past a million would move in steps
        (1_827_580_123.0, "1827580123"),  # a certificate notAfter in Unix seconds, to the second
        (0.5, "0.5"),
        (0.000123, "0.000123"),
        (2.0**60, repr(2.0**60)),  # beyond exact integers: the float's shortest round-trip form
    ],
)
def test_values_keep_full_precision(value: float, rendered: str) -> None:
    m = Metrics()
    m.inc("gpu_admission_requests_total", (("webhook", "admit"), ("verdict", "allow")), value)
    m.gauge("gpu_admission_cert_expiry_timestamp_seconds", "notAfter", lambda: [((), value)])
    text = m.render()
    assert _sample(text, 'gpu_admission_requests_total{webhook="admit",verdict="allow"}') == rendered
    assert _sample(text, "gpu_admission_cert_expiry_timestamp_seconds ") == rendered
    assert float(rendered) == value


def test_histogram_counts_are_integers_and_cumulative() -> None:
    m = Metrics()
    m.observe(0.0004, (("webhook", "admit"),))
    m.observe(0.003, (("webhook", "admit"),))
    text = m.render()
    assert _sample(text, 'gpu_admission_request_duration_seconds_bucket{webhook="admit",le="0.0005"}') == "1"
    assert _sample(text, 'gpu_admission_request_duration_seconds_bucket{webhook="admit",le="0.005"}') == "2"
    assert _sample(text, 'gpu_admission_request_duration_seconds_bucket{webhook="admit",le="+Inf"}') == "2"
    assert _sample(text, 'gpu_admission_request_duration_seconds_count{webhook="admit"}') == "2"


def test_label_values_are_escaped() -> None:
    m = Metrics()
    m.inc("gpu_admission_rule_results_total", (("rule", 'a"b\\c'), ("outcome", "deny")))
    assert 'gpu_admission_rule_results_total{rule="a\\"b\\\\c",outcome="deny"} 1' in m.render()


def test_every_total_is_a_counter_and_typed_once() -> None:
    """Prometheus naming: a `_total` series is a counter, including counts read at scrape time."""
    m = Metrics()
    m.inc("gpu_admission_requests_total", (("webhook", "admit"), ("verdict", "allow")))
    m.gauge("gpu_admission_policy_reload_failures_total", "rejected edits", lambda: [((), 2.0)], kind="counter")
    m.gauge("gpu_admission_inflight", "in flight", lambda: [((), 0.0)])
    types = dict(line.split()[2:4] for line in m.render().splitlines() if line.startswith("# TYPE"))
    assert types == {
        "gpu_admission_requests_total": "counter",
        "gpu_admission_policy_reload_failures_total": "counter",
        "gpu_admission_inflight": "gauge",
    }
