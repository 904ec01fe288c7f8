"""The policy document: every error names its field path (and YAML line), all errors at once."""

from __future__ import annotations

import pytest
import yaml

from policies.document import PolicyError, compile_policy, default_policy, default_policy_text, parse_policy_text

HEAD = "apiVersion: gpu-admission.io/v1alpha1\nkind: Policy\n"


@pytest.mark.parametrize(
    ("body", "error"),
    [
        ("rules:\n  training-same-rack: deny\n", "rules.training-same-rack (line 4): must be one of"),
        ("rules:\n  gpu-request-fit: enforce\n", "rules.gpu-request-fit (line 4): unknown field (did you mean"),
        ("mutations:\n  gpu-slice: yes-please\n", "mutations.gpu-slice (line 4): must be true or false"),
        ("inference:\n  warmPool: -1\n", "inference.warmPool (line 4): must be between 0 and 100000, got -1"),
        ("training:\n  queue: {system: kueue}\n", "training.queue (line 4): system and name go together"),
        ("training:\n  pool: h100\n", "training.pool (line 4): names no declared pool"),
        ("pools:\n  - name: a\n    nodeSelector: {}\n", "pools[0].nodeSelector (line 5): must be a non-empty mapping"),
        ("pools:\n  - {name: a, nodeSelector: {x: y}}\n  - {name: a, nodeSelector: {x: z}}\n", "pools[1].name"),
        ("comm:\n  messageSize: lots\n", "comm.messageSize (line 4):"),
        ("gpuNodes:\n  tolerations: [{key: k, operator: Exists, value: v}]\n", "gpuNodes.tolerations[0].value"),
        ("failureMode: sometimes\n", "failureMode (line 3): must be one of 'closed', 'open'"),
        ("topology:\n  rack: ''\n", "topology.rack (line 4): must be 'auto' or a node label key"),
        ("extra: 1\n", "extra (line 3): unknown field"),
        ('rules:\n  "a\\nb": 1\n', "rules.a\\nb: unknown field"),  # a line break in a key stays escaped
    ],
)
def test_errors_name_the_field_path_and_line(body: str, error: str) -> None:
    with pytest.raises(PolicyError) as info:
        parse_policy_text(HEAD + body)
    assert any(e.startswith(error) for e in info.value.errors), info.value.errors


def test_all_errors_are_reported_at_once() -> None:
    with pytest.raises(PolicyError) as info:
        parse_policy_text(HEAD + "rules: {training-same-rack: deny}\ninference: {warmPool: -1}\nfailureMode: x\n")
    assert len(info.value.errors) == 3


@pytest.mark.parametrize("text", ["", "[]", "apiVersion: v1\nkind: ConfigMap\n", "a: [\n", "kind: Policy\n"])
def test_not_a_policy(text: str) -> None:
    with pytest.raises(PolicyError) as info:
        parse_policy_text(text)
    assert info.value.errors and all("\n" not in e for e in info.value.errors)


def test_yaml_errors_carry_the_line() -> None:
    with pytest.raises(PolicyError) as info:
        parse_policy_text(HEAD + "rules:\n  a: [\n")
    assert info.value.errors[0].startswith("line ")


def test_default_policy_is_valid_and_complete() -> None:
    policy = default_policy()
    doc = yaml.safe_load(default_policy_text())
    assert set(doc["rules"]) == set(policy.rules) and set(doc["mutations"]) == set(policy.mutations)
    assert policy.hash.startswith("sha256:") and policy.failure_mode == "closed"


def test_omitted_rules_keep_their_default_action() -> None:
    policy = compile_policy({"apiVersion": "gpu-admission.io/v1alpha1", "kind": "Policy"})
    assert policy.rules["training-queue-priority"] == "warn" and policy.rules["training-same-rack"] == "enforce"


def test_hash_changes_with_the_text() -> None:
    a = parse_policy_text(default_policy_text())
    b = parse_policy_text(default_policy_text().replace("warmPool: 1", "warmPool: 2"))
    assert a.hash != b.hash


def test_a_bad_gang_scheduler_setting_is_an_error_not_the_default() -> None:
    # These four were once read after the error check: `kueue: please` compiled with the gang setting off and
    # no error, so `policy validate` passed a policy whose placement silently ignored the operator's intent.
    with pytest.raises(PolicyError) as info:
        parse_policy_text(
            HEAD + "placement:\n  gangSchedulers:\n    kueue: please\n    volcano: 1\n    kaiTopology: 5\n"
            "    workload: 'no'\n"
        )
    assert info.value.errors == [
        "placement.gangSchedulers.kueue (line 5): must be true or false, got 'please'",
        "placement.gangSchedulers.volcano (line 6): must be true or false, got 1",
        "placement.gangSchedulers.kaiTopology (line 7): must be a string, got integer",
        "placement.gangSchedulers.workload (line 8): must be true or false, got 'no'",
    ]
