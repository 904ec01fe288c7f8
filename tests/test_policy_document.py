"""The policy document: every error names its field path (and YAML line), all errors at once."""

from __future__ import annotations

import dataclasses
import datetime
import hashlib
from typing import Any

import pytest
import yaml

from policies import comm
from policies.document import (
    MUTATION_IDS,
    RULE_IDS,
    CommSettings,
    Policy,
    PolicyError,
    Pool,
    Toleration,
    compile_policy,
    default_policy,
    default_policy_text,
    parse_policy_text,
)

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
    with pytest.raises(PolicyError) as info:
        compile_policy({**BASE, "placement": {"gangSchedulers": {"kaiTopology": "t" * 1025}}})
    assert info.value.errors == ["placement.gangSchedulers.kaiTopology: must be at most 1024 characters, got 1025"]


# Every error the document can give, whole: the path, the message and the figure it quotes. Each row is one
# document (apiVersion and kind added) and the exact errors it gets, in order.
BASE = {"apiVersion": "gpu-admission.io/v1alpha1", "kind": "Policy"}
DEFAULT_WARN = {"training-topology-scheduler", "scheduler-topology-keys", "training-queue-priority"}
RACK_LONG = "r" * 1025
SELECTOR_LONG = {"k" * 1000: "v" * 25}
ERRORS: dict[str, tuple[dict[str, Any], list[str]]] = {
    "unknown-top-fields": (
        {"rulez": {}, "Kind2": 1, "xy": 1},
        [
            "rulez: unknown field (did you mean 'rules'?)",
            "Kind2: unknown field (did you mean 'kind'?)",
            "xy: unknown field",
        ],
    ),
    "api-version-and-kind": (
        {"apiVersion": "v1", "kind": "ConfigMap"},
        ["apiVersion: must be 'gpu-admission.io/v1alpha1', got 'v1'", "kind: must be 'Policy', got 'ConfigMap'"],
    ),
    "choices": (
        {"failureMode": "x", "defaultEnforcement": 5},
        [
            "failureMode: must be one of 'closed', 'open', got 'x'",
            "defaultEnforcement: must be one of 'enforce', 'warn', 'audit', 'off', got 5",
        ],
    ),
    "rules": (
        {"rules": {"training-same-rack": "deny", "gpu-request-fit": "warn", "dra-claims": None}},
        [
            "rules.gpu-request-fit: unknown field (did you mean 'gpu-request-fits'?)",
            "rules.training-same-rack: must be one of 'enforce', 'warn', 'audit', 'off', got 'deny'",
        ],
    ),
    "sections-not-mappings": (
        {
            "rules": ["a"],
            "mutations": "x",
            "topology": 3,
            "training": 1.5,
            "inference": True,
            "gpuNodes": [],
            "comm": "fast",
            "placement": 0,
        },
        [
            "rules: must be a mapping, got list",
            "mutations: must be a mapping, got string",
            "topology: must be a mapping, got integer",
            "training: must be a mapping, got number",
            "inference: must be a mapping, got boolean",
            "gpuNodes: must be a mapping, got list",
            "comm: must be a mapping, got string",
            "placement: must be a mapping, got integer",
        ],
    ),
    "nested-sections-not-mappings": (
        {
            "training": {"queue": "kueue", "pool": 5},
            "inference": {"spread": ["zones"]},
            "placement": {"gangSchedulers": "kueue"},
            "rules": datetime.date(2026, 12, 2),  # YAML reads an unquoted date as one
        },
        [
            "rules: must be a mapping, got date",
            "training.pool: must be a string, got integer",
            "training.queue: must be a mapping, got string",
            "inference.spread: must be a mapping, got list",
            "placement.gangSchedulers: must be a mapping, got string",
        ],
    ),
    "mutations": (
        {"mutations": {"gpu-slice": "yes", "job-sizes": True}},
        [
            "mutations.job-sizes: unknown field (did you mean 'job-size'?)",
            "mutations.gpu-slice: must be true or false, got 'yes'",
        ],
    ),
    "topology": (
        {"topology": {"rack": 5, "levels": "x", "racks": 1}},
        [
            "topology.racks: unknown field (did you mean 'rack'?)",
            "topology.rack: must be a string, got integer",
            "topology.levels: must be a list of node label keys, narrowest first",
        ],
    ),
    "rack-too-long": ({"topology": {"rack": RACK_LONG}}, ["topology.rack: must be at most 1024 characters, got 1025"]),
    "rack-empty": ({"topology": {"rack": ""}}, ["topology.rack: must be 'auto' or a node label key"]),
    "levels-twice-without-the-rack": (
        {"topology": {"rack": "r", "levels": ["a", "a"]}},
        ["topology.levels: lists a key twice", "topology.levels: must include topology.rack 'r'"],
    ),
    "levels-empty-key": (
        {"topology": {"rack": "r", "levels": ["a", ""]}},
        ["topology.levels: must be a list of node label keys, narrowest first"],
    ),
    "levels-not-strings": (
        {"topology": {"levels": ["a", 5]}},
        ["topology.levels: must be a list of node label keys, narrowest first"],
    ),
    "pools-not-a-list": ({"pools": {"a": 1}}, ["pools: must be a list, got mapping"]),
    "pools-entries": (
        {
            "pools": [
                1,
                {"nodeSelector": {"x": "y"}},
                {"name": "a", "nodeSelector": {"x": 1}},
                {"name": "a", "nodeSelector": {"x": "y"}, "gpus": 1},
                {"name": "b", "nodeSelector": {}},
                {"name": "c", "nodeSelector": {5: "y"}},
                {"name": "d"},
            ]
        },
        [
            "pools[0]: must be a mapping, got integer",
            "pools[1].name: is required",
            "pools[2].nodeSelector: must be a non-empty mapping of label keys to string values",
            "pools[3].gpus: unknown field",
            "pools[3].name: duplicate pool name 'a'",
            "pools[4].nodeSelector: must be a non-empty mapping of label keys to string values",
            "pools[5].nodeSelector: must be a non-empty mapping of label keys to string values",
            "pools[6].nodeSelector: must be a non-empty mapping of label keys to string values",
        ],
    ),
    "pool-fields": (
        {
            "pools": [
                {
                    "name": "a",
                    "nodeSelector": {"x": "y"},
                    "gpusPerNode": 65,
                    "nodes": 0,
                    "replicas": 1025,
                    "sharing": "all",
                    "migStrategy": "some",
                    "product": 5,
                    "rack": [],
                    "migProfiles": {"1g.10gb": 1025},
                }
            ]
        },
        [
            "pools[0].migProfiles: slice counts must be between 0 and 1024",
            "pools[0].product: must be a string, got integer",
            "pools[0].gpusPerNode: must be between 0 and 64, got 65",
            "pools[0].nodes: must be between 1 and 10000, got 0",
            "pools[0].rack: must be a string, got list",
            "pools[0].sharing: must be one of 'none', 'time-slicing', 'mps', got 'all'",
            "pools[0].replicas: must be between 1 and 1024, got 1025",
            "pools[0].migStrategy: must be one of 'none', 'single', 'mixed', got 'some'",
        ],
    ),
    "pool-fields-below-their-ranges": (
        {
            "pools": [
                {
                    "name": "a",
                    "nodeSelector": {"x": "y"},
                    "gpusPerNode": -1,
                    "replicas": 0,
                    "migProfiles": {"1g.10gb": -1},
                }
            ]
        },
        [
            "pools[0].migProfiles: slice counts must be between 0 and 1024",
            "pools[0].gpusPerNode: must be between 0 and 64, got -1",
            "pools[0].replicas: must be between 1 and 1024, got 0",
        ],
    ),
    "pool-selector-too-long-and-profiles-not-counts": (
        {"pools": [{"name": "a", "nodeSelector": SELECTOR_LONG, "migProfiles": {"1g.10gb": True}}]},
        [
            "pools[0].nodeSelector: keys and values must be at most 1024 characters",
            "pools[0].migProfiles: must map MIG profile names (e.g. 1g.10gb) to slice counts",
        ],
    ),
    "pool-profiles-not-a-mapping-or-keyed-by-long-names": (
        {
            "pools": [
                {"name": "a", "nodeSelector": {"x": "y"}, "migProfiles": ["1g.10gb"]},
                {"name": "b", "nodeSelector": {"x": "y"}, "migProfiles": {"p" * 1025: 1}},
                {"name": "c", "nodeSelector": {"x": "y"}, "migProfiles": {5: 1}},
            ]
        },
        [
            "pools[0].migProfiles: must map MIG profile names (e.g. 1g.10gb) to slice counts",
            "pools[1].migProfiles: must map MIG profile names (e.g. 1g.10gb) to slice counts",
            "pools[2].migProfiles: must map MIG profile names (e.g. 1g.10gb) to slice counts",
        ],
    ),
    "pool-profile-count-a-string-and-pool-name-a-number": (
        {
            "pools": [
                {"name": "a", "nodeSelector": {"x": "y"}, "migProfiles": {"1g.10gb": "7"}},
                {"name": 5, "nodeSelector": {"x": "y"}},
            ]
        },
        [
            "pools[0].migProfiles: must map MIG profile names (e.g. 1g.10gb) to slice counts",
            "pools[1].name: must be a string, got integer",
            "pools[1].name: is required",
        ],
    ),
    "keys-with-a-backslash-or-a-prefix-shared-by-several-options": (
        {"rules": {"a\\b": 1, "training-x": 1}},
        # the key as written; of four rules starting "training-", the first listed is the hint
        ["rules.a\\b: unknown field", "rules.training-x: unknown field (did you mean 'training-same-rack'?)"],
    ),
    "pools-declare-too-many-nodes": (
        {
            "pools": [
                {"name": "a", "nodeSelector": {"x": "y"}, "nodes": 6000},
                {"name": "b", "nodeSelector": {"x": "z"}, "nodes": 4001},
            ]
        },
        ["pools: declare at most 10000 nodes in all, got 10001"],
    ),
    "training": (
        {"training": {"pool": "h100", "queue": {"system": "kueue"}, "topologySchedulers": ["v", ""], "schedulers": 1}},
        [
            "training.schedulers: unknown field (did you mean 'schedulerName'?)",
            "training.pool: names no declared pool: 'h100'",
            "training.queue: system and name go together: set both or neither",
            "training.topologySchedulers: must be a list of scheduler names",
        ],
    ),
    "training-queue-name-alone": (
        {
            "training": {
                "queue": {"name": "q", "sys": 1},
                "topologySchedulers": "volcano",
                "schedulerName": 5,
                "priorityClassName": [],
            }
        },
        [
            "training.schedulerName: must be a string, got integer",
            "training.priorityClassName: must be a string, got list",
            "training.queue.sys: unknown field (did you mean 'system'?)",
            "training.queue: system and name go together: set both or neither",
            "training.topologySchedulers: must be a list of scheduler names",
        ],
    ),
    "training-queue-fields": (
        {"training": {"queue": {"system": "slurm", "name": 5}, "topologySchedulers": ["s" * 1025, 5]}},
        [
            "training.queue.system: must be one of '', 'kueue', 'volcano', 'kai', got 'slurm'",
            "training.queue.name: must be a string, got integer",
            "training.topologySchedulers: must be a list of scheduler names",
        ],
    ),
    "inference": (
        {
            "inference": {
                "warmPool": "2",
                "spread": {"whenUnsatisfiable": "Never", "zones": "yes", "zone": 1},
                "warm": 1,
            }
        },
        [
            "inference.warm: unknown field (did you mean 'warmPool'?)",
            "inference.warmPool: must be an integer, got '2'",
            "inference.spread.zone: unknown field (did you mean 'zones'?)",
            "inference.spread.whenUnsatisfiable: must be one of 'ScheduleAnyway', 'DoNotSchedule', got 'Never'",
            "inference.spread.zones: must be true or false, got 'yes'",
        ],
    ),
    "warm-pool-a-boolean": ({"inference": {"warmPool": True}}, ["inference.warmPool: must be an integer, got True"]),
    "warm-pool-above": (
        {"inference": {"warmPool": 100001}},
        ["inference.warmPool: must be between 0 and 100000, got 100001"],
    ),
    "warm-pool-below": ({"inference": {"warmPool": -1}}, ["inference.warmPool: must be between 0 and 100000, got -1"]),
    "gpu-nodes": (
        {"gpuNodes": {"tolerations": "x", "taints": 1}},
        ["gpuNodes.taints: unknown field", "gpuNodes.tolerations: must be a list, got string"],
    ),
    "tolerations": (
        {
            "gpuNodes": {
                "tolerations": [
                    1,
                    {"key": "k", "operator": "In", "effect": "Never", "value": 3, "val": 1},
                    {"operator": "Exists", "value": "v"},
                    {"key": 5},
                ]
            }
        },
        [
            "gpuNodes.tolerations[0]: must be a mapping",
            "gpuNodes.tolerations[1].val: unknown field (did you mean 'value'?)",
            "gpuNodes.tolerations[1].operator: must be one of 'Exists', 'Equal', got 'In'",
            "gpuNodes.tolerations[1].effect: must be one of '', 'NoSchedule', 'PreferNoSchedule', 'NoExecute', got"
            " 'Never'",
            "gpuNodes.tolerations[1].value: must be a string, got integer",
            "gpuNodes.tolerations[2].value: must be empty when operator is Exists",
            "gpuNodes.tolerations[3].key: must be a string, got integer",
        ],
    ),
    "comm": (
        {
            "comm": {
                "messageSize": "lots",
                "nvlinkGbps": float("nan"),
                "networkGbps": 0,
                "crossRackOversubscription": 1001,
                "size": 1,
            }
        },
        [
            "comm.size: unknown field",
            "comm.messageSize: invalid quantity 'lots': expected a number with an optional suffix, e.g. 10Gi, 20G,"
            " 1.5Gi or 500m",
            "comm.nvlinkGbps: must be a finite number, got nan",
            "comm.networkGbps: must be positive and at most 100000, got 0",
            "comm.crossRackOversubscription: must be at least 1 and at most 1000, got 1001",
        ],
    ),
    "comm-not-finite-or-not-numbers": (
        {
            "comm": {
                "messageSize": float("inf"),
                "nvlinkGbps": True,
                "networkGbps": 100001,
                "crossRackOversubscription": "2",
            }
        },
        [
            "comm.messageSize: must be a finite size, got inf",
            "comm.nvlinkGbps: must be a finite number, got True",
            "comm.networkGbps: must be positive and at most 100000, got 100001",
            "comm.crossRackOversubscription: must be a finite number, got '2'",
        ],
    ),
    "comm-numbers-below": (
        {"comm": {"nvlinkGbps": -1, "crossRackOversubscription": float("-inf")}},
        [
            "comm.nvlinkGbps: must be positive and at most 100000, got -1",
            "comm.crossRackOversubscription: must be a finite number, got -inf",
        ],
    ),
    "message-size-above": (
        {"comm": {"messageSize": "2Ti"}},
        ["comm.messageSize: must be positive and at most 1Ti, got '2Ti'"],
    ),
    "message-size-zero": ({"comm": {"messageSize": 0}}, ["comm.messageSize: must be positive and at most 1Ti, got 0"]),
    "message-size-negative": (
        {"comm": {"messageSize": "-1Mi"}},
        ["comm.messageSize: invalid quantity '-1Mi': a size must not be negative"],
    ),
    "placement": (
        {
            "placement": {
                "whenNoDomainFits": "never",
                "reservationSeconds": 0,
                "noPodsGraceSeconds": 86401,
                "waitingGraceSeconds": 1.5,
                "gangSchedulers": {"slurm": True},
                "x": 1,
            }
        },
        [
            "placement.x: unknown field",
            "placement.whenNoDomainFits: must be one of 'prefer', 'deny', got 'never'",
            "placement.reservationSeconds: must be between 1 and 86400, got 0",
            "placement.noPodsGraceSeconds: must be between 1 and 86400, got 86401",
            "placement.waitingGraceSeconds: must be an integer, got 1.5",
            "placement.gangSchedulers.slurm: unknown field",
        ],
    ),
    "placement-bounds": (
        {"placement": {"reservationSeconds": 86401, "noPodsGraceSeconds": 0, "waitingGraceSeconds": 0}},
        [
            "placement.reservationSeconds: must be between 1 and 86400, got 86401",
            "placement.noPodsGraceSeconds: must be between 1 and 86400, got 0",
            "placement.waitingGraceSeconds: must be between 1 and 86400, got 0",
        ],
    ),
}


@pytest.mark.parametrize("name", ERRORS)
def test_every_error_is_whole_and_in_order(name: str) -> None:
    extra, errors = ERRORS[name]
    with pytest.raises(PolicyError) as info:
        compile_policy({**BASE, **extra})
    assert info.value.errors == errors


def _many(n: int) -> dict[str, Any]:
    return {f"k{i}": "v" for i in range(n)}


# Past its limit a list is not read at all: the entries below would each add an error (or 10 nodes each, past the
# 10,000 in all), and only the limit is reported.
@pytest.mark.parametrize(
    ("extra", "errors"),
    [
        (
            {"pools": [{"name": f"p{i}", "nodeSelector": {"x": "y"}, "nodes": 10} for i in range(1001)]},
            ["pools: must have at most 1000 entries, got 1001"],
        ),
        (
            {"pools": [{"name": "a", "nodeSelector": _many(1001), "migProfiles": dict.fromkeys(_many(1001), 2000)}]},
            [
                "pools[0].nodeSelector: must have at most 1000 entries, got 1001",
                "pools[0].migProfiles: must have at most 1000 entries, got 1001",
            ],
        ),
        (
            {"training": {"topologySchedulers": ["s"] * 1001}},
            ["training.topologySchedulers: must have at most 1000 entries, got 1001"],
        ),
        (
            {"gpuNodes": {"tolerations": [{"key": 5}] * 1001}},
            ["gpuNodes.tolerations: must have at most 1000 entries, got 1001"],
        ),
        (  # at 1000 entries the selector is read, and a key too long is named
            {"pools": [{"name": "a", "nodeSelector": {**_many(999), "k" * 1024: "v"}}]},
            ["pools[0].nodeSelector: keys and values must be at most 1024 characters"],
        ),
    ],
)
def test_lists_past_the_limit_name_it_once(extra: dict[str, Any], errors: list[str]) -> None:
    with pytest.raises(PolicyError) as info:
        compile_policy({**BASE, **extra})
    assert info.value.errors == errors


def test_lists_and_sizes_at_the_limit_compile() -> None:
    policy = compile_policy(
        {
            **BASE,
            "pools": [
                {
                    "name": "a",
                    "nodeSelector": _many(1000),
                    "migProfiles": dict.fromkeys(_many(1000), 1024),
                    "nodes": 9001,
                },
                {
                    "name": "b",
                    "nodeSelector": {"k" * 1000: "v" * 24},
                    "nodes": 1,
                    "gpusPerNode": 64,
                    "replicas": 1024,
                    "migProfiles": {"p" * 1024: 1},
                },
            ]
            + [{"name": f"p{i}", "nodeSelector": {"x": "y"}, "migProfiles": {"1g.10gb": 0}} for i in range(998)],
            "training": {"topologySchedulers": ["s" * 1024] * 1000},
            "gpuNodes": {"tolerations": [{"key": "k"}] * 1000},
            "topology": {"rack": "r" * 1024},
            "comm": {
                "messageSize": "1Ti",
                "nvlinkGbps": 100000,
                "networkGbps": 1e-9,
                "crossRackOversubscription": 1000,
            },
            "inference": {"warmPool": 100000},
            "placement": {"reservationSeconds": 86400, "noPodsGraceSeconds": 1, "waitingGraceSeconds": 86400},
        }
    )
    assert len(policy.pools) == 1000 and len(policy.tolerations) == 1000
    assert len(policy.pools[0].node_selector) == 1000 and len(policy.pools[0].mig_profiles) == 1000
    assert policy.pools[1].gpus_per_node == 64 and policy.pools[1].replicas == 1024
    assert sum(p.nodes for p in policy.pools) == 10000  # 9001 + 1 + 998 pools of the default 1: the limit
    assert policy.comm.message_bytes == 2**40 and policy.comm.cross_rack_oversubscription == 1000.0
    assert policy.warm_pool == 100000 and policy.reservation_seconds == 86400.0


def _fields(policy: Policy) -> dict[str, Any]:
    return {f.name: getattr(policy, f.name) for f in dataclasses.fields(policy) if f.name not in ("hash", "document")}


def test_a_document_of_only_its_kind_compiles_to_the_documented_defaults() -> None:
    assert _fields(compile_policy(dict(BASE))) == {
        "failure_mode": "closed",
        "default_enforcement": "enforce",
        "rules": {r: "warn" if r in DEFAULT_WARN else "enforce" for r in RULE_IDS},
        "mutations": dict.fromkeys(MUTATION_IDS, True),
        "rack": "auto",
        "levels": (),
        "pools": (),
        "training_pool": "",
        "scheduler_name": "",
        "queue_system": "",
        "queue_name": "",
        "priority_class": "",
        "topology_schedulers": frozenset({"volcano", "kai-scheduler"}),
        "warm_pool": 1,
        "spread_when_unsatisfiable": "ScheduleAnyway",
        "spread_zones": True,
        "tolerations": (),
        "comm": CommSettings(
            message_bytes=16 * 2**20, nvlink_gbps=400.0, network_gbps=200.0, cross_rack_oversubscription=2.0
        ),
        "when_no_domain_fits": "prefer",
        "reservation_seconds": 120.0,
        "no_pods_grace_seconds": 15.0,
        "waiting_grace_seconds": 30.0,
        "gang_kueue": False,
        "gang_volcano": False,
        "gang_kai_topology": "",
        "gang_workload": False,
    }


def test_nulls_read_as_their_defaults() -> None:
    nulls = {
        "failureMode": None,
        "rules": None,
        "topology": {"rack": None},
        "pools": None,
        "training": {"queue": None, "pool": None},
        "inference": {"spread": {"whenUnsatisfiable": None}},
        "gpuNodes": {"tolerations": None},
    }
    assert _fields(compile_policy({**BASE, **nulls})) == _fields(compile_policy(dict(BASE)))


def test_every_field_of_a_full_document_is_read() -> None:
    doc = {
        **BASE,
        "failureMode": "open",
        "defaultEnforcement": "audit",
        "rules": dict.fromkeys(RULE_IDS, "off"),
        "mutations": dict.fromkeys(MUTATION_IDS, False),
        "topology": {"rack": "example.com/rack", "levels": ["kubernetes.io/hostname", "example.com/rack", "zone"]},
        "pools": [
            {
                "name": "h100",
                "nodeSelector": {"pool": "h100"},
                "product": "NVIDIA-H100-80GB-HBM3",
                "gpusPerNode": 8,
                "nodes": 4,
                "rack": "r1",
                "sharing": "time-slicing",
                "replicas": 4,
                "migStrategy": "mixed",
                "migProfiles": {"1g.10gb": 7},
            },
            {"name": "l4", "nodeSelector": {"pool": "l4"}, "migProfiles": None},
        ],
        "training": {
            "pool": "h100",
            "schedulerName": "volcano",
            "queue": {"system": "kueue", "name": "research"},
            "priorityClassName": "high",
            "topologySchedulers": ["volcano"],
        },
        "inference": {"warmPool": 0, "spread": {"whenUnsatisfiable": "DoNotSchedule", "zones": False}},
        "gpuNodes": {
            "tolerations": [
                {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
                {"key": "dedicated", "value": "gpu"},
            ]
        },
        "comm": {"messageSize": "1Gi", "nvlinkGbps": 900, "networkGbps": 400.5, "crossRackOversubscription": 3},
        "placement": {
            "whenNoDomainFits": "deny",
            "reservationSeconds": 600,
            "noPodsGraceSeconds": 20,
            "waitingGraceSeconds": 40,
            "gangSchedulers": {"kueue": True, "volcano": True, "kaiTopology": "cluster-topology", "workload": True},
        },
    }
    policy = compile_policy(doc)
    assert _fields(policy) == {
        "failure_mode": "open",
        "default_enforcement": "audit",
        "rules": dict.fromkeys(RULE_IDS, "off"),
        "mutations": dict.fromkeys(MUTATION_IDS, False),
        "rack": "example.com/rack",
        "levels": ("kubernetes.io/hostname", "example.com/rack", "zone"),
        "pools": (
            Pool(
                name="h100",
                node_selector={"pool": "h100"},
                product="NVIDIA-H100-80GB-HBM3",
                gpus_per_node=8,
                nodes=4,
                rack="r1",
                sharing="time-slicing",
                replicas=4,
                mig_strategy="mixed",
                mig_profiles={"1g.10gb": 7},
            ),
            Pool(name="l4", node_selector={"pool": "l4"}),
        ),
        "training_pool": "h100",
        "scheduler_name": "volcano",
        "queue_system": "kueue",
        "queue_name": "research",
        "priority_class": "high",
        "topology_schedulers": frozenset({"volcano"}),
        "warm_pool": 0,
        "spread_when_unsatisfiable": "DoNotSchedule",
        "spread_zones": False,
        "tolerations": (
            Toleration(key="nvidia.com/gpu", operator="Exists", value="", effect="NoSchedule"),
            Toleration(key="dedicated", operator="Equal", value="gpu", effect=""),
        ),
        "comm": CommSettings(
            message_bytes=2**30, nvlink_gbps=900.0, network_gbps=400.5, cross_rack_oversubscription=3.0
        ),
        "when_no_domain_fits": "deny",
        "reservation_seconds": 600.0,
        "no_pods_grace_seconds": 20.0,
        "waiting_grace_seconds": 40.0,
        "gang_kueue": True,
        "gang_volcano": True,
        "gang_kai_topology": "cluster-topology",
        "gang_workload": True,
    }
    assert policy.document is doc
    assert type(policy.reservation_seconds) is float and type(policy.comm.nvlink_gbps) is float
    # The pieces the engine reads through methods.
    assert policy.pool("l4") is policy.pools[1] and policy.pool("h100") is policy.pools[0] and policy.pool("a") is None
    assert [t.as_json() for t in policy.tolerations] == [
        {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
        {"key": "dedicated", "operator": "Equal", "value": "gpu"},
    ]
    assert policy.comm.bandwidths() == comm.Bandwidths(
        nvlink_gbps=900.0, network_gbps=400.5, cross_rack_oversubscription=3.0
    )


@pytest.mark.parametrize(
    ("text", "errors"),
    [
        (  # entries of a list carry their own line; an error of a whole entry too
            HEAD + "pools:\n  - name: a\n    nodeSelector: {x: y}\n  - name: a\n    nodeSelector: {x: y}\n  - 5\n",
            ["pools[1].name (line 6): duplicate pool name 'a'", "pools[2] (line 8): must be a mapping, got integer"],
        ),
        (HEAD + "pools: 5\n", ["pools (line 3): must be a list, got integer"]),
        (  # errors of no field (the document's own) have no line
            "a: 1\n",
            [
                "a (line 1): unknown field",
                "apiVersion: must be 'gpu-admission.io/v1alpha1', got None",
                "kind: must be 'Policy', got None",
            ],
        ),
        ("[]", ["(root): must be a mapping, got list"]),
        ("", ["(root): must be a mapping, got NoneType"]),
        (HEAD + "x: *a\n", ["line 3, column 4: invalid YAML: found undefined alias 'a'"]),
        ("a: \x00", ["(document): invalid YAML: unacceptable character #x0000: special characters are not allowed"]),
        (HEAD + "x: " + "[" * 101 + "]" * 101 + "\n", ["line 3, column 103: nested deeper than 100 levels"]),
        ("é" * (2**19 + 1), ["(document): larger than 1048576 bytes (the most one ConfigMap holds)"]),
        ("#" * (2**20 + 1), ["(document): larger than 1048576 bytes (the most one ConfigMap holds)"]),
    ],
)
def test_parse_errors_whole(text: str, errors: list[str]) -> None:
    with pytest.raises(PolicyError) as info:
        parse_policy_text(text)
    assert info.value.errors == errors


def test_a_document_of_exactly_one_mebibyte_is_read() -> None:
    # 2**20 characters of comment after the head is read (and is a valid, empty policy); one byte more is not
    text = HEAD + "#" * (2**20 - len(HEAD))
    assert parse_policy_text(text).hash.startswith("sha256:")


def test_the_error_message_counts_the_errors_after_the_first() -> None:
    assert str(PolicyError(["a: x"])) == "a: x"
    assert str(PolicyError(["a: x", "b: y"])) == "a: x (and 1 more)"
    assert str(PolicyError(["a: x", "b: y", "c: z"])) == "a: x (and 2 more)"
    assert str(PolicyError([])) == "invalid policy"


def test_a_document_nested_past_the_limit_is_refused_before_it_is_read() -> None:
    deep: dict[str, Any] = {}
    for _ in range(101):
        deep = {"a": deep}
    with pytest.raises(PolicyError) as info:
        compile_policy({**BASE, "rules": deep})
    assert info.value.errors == ["(root): nests deeper than 100 levels"]


@pytest.mark.parametrize(
    ("key", "hint"),
    [
        ("rul", "rules"),  # 3 letters are enough for a short option
        ("ru", None),  # 2 are not
        ("gpu", None),  # 3 of 8 letters are not enough for a long one (8 // 2 = 4) ...
        ("gpuN", "gpuNodes"),  # ... 4 are
        ("GPUNODES", "gpuNodes"),  # case does not matter
        ("placem", "placement"),  # 6 letters of placement: 9 // 2 = 4 needed
        ("plac", "placement"),  # exactly 4
        ("pla", None),  # 3 < 4
        ("tr", None),
    ],
)
def test_did_you_mean_needs_a_long_enough_common_prefix(key: str, hint: str | None) -> None:
    with pytest.raises(PolicyError) as info:
        compile_policy({**BASE, key: 1})
    assert info.value.errors == [f"{key}: unknown field" + (f" (did you mean {hint!r}?)" if hint else "")]


@pytest.mark.parametrize(
    ("value", "shown"),
    [
        ("x" * 78, "'" + "x" * 78 + "'"),  # a repr of 80 characters is shown whole
        ("x" * 79, "'" + "x" * 76 + "..."),  # one more is cut to 77 and an ellipsis: 80 again
    ],
)
def test_a_value_quoted_in_an_error_is_cut_at_80_characters(value: str, shown: str) -> None:
    with pytest.raises(PolicyError) as info:
        compile_policy({**BASE, "inference": {"warmPool": value}})
    assert info.value.errors == [f"inference.warmPool: must be an integer, got {shown}"]


@pytest.mark.parametrize(
    ("topology", "levels"),
    [
        ({"rack": "auto", "levels": ["a", "b"]}, ("a", "b")),  # an auto rack need not be listed
        ({"rack": "r", "levels": []}, ()),  # no levels: auto-detected, the rack among them
        ({"rack": "b", "levels": ["a", "b"]}, ("a", "b")),
    ],
)
def test_levels_need_the_rack_only_when_both_are_set(topology: dict[str, Any], levels: tuple[str, ...]) -> None:
    assert compile_policy({**BASE, "topology": topology}).levels == levels


def test_a_finite_float_message_size_is_a_size() -> None:
    assert compile_policy({**BASE, "comm": {"messageSize": 1048576.0}}).comm.message_bytes == 2**20


def test_the_hash_is_of_the_text_or_of_the_sorted_document() -> None:
    text = default_policy_text()
    assert parse_policy_text(text).hash == "sha256:" + hashlib.sha256(text.encode()).hexdigest()[:16]
    # a document without its text hashes as sorted YAML: the order of its keys does not matter
    a = compile_policy({**BASE, "failureMode": "open", "inference": {"warmPool": 2}})
    b = compile_policy({"inference": {"warmPool": 2}, "failureMode": "open", **BASE})
    canonical = yaml.safe_dump({**BASE, "failureMode": "open", "inference": {"warmPool": 2}}, sort_keys=True)
    assert a.hash == b.hash == "sha256:" + hashlib.sha256(canonical.encode()).hexdigest()[:16]


@pytest.mark.parametrize(
    ("value", "error"),
    [
        ("1", None),  # a non-blocking fabric: the bound itself
        ("1000", None),
        ("0.999", "comm.crossRackOversubscription (line 4): must be at least 1 and at most 1000, got 0.999"),
        ("0.5", "comm.crossRackOversubscription (line 4): must be at least 1 and at most 1000, got 0.5"),
        ("1000.5", "comm.crossRackOversubscription (line 4): must be at least 1 and at most 1000, got 1000.5"),
    ],
)
def test_cross_rack_oversubscription_is_at_least_one(value: str, error: str | None) -> None:
    """Below 1 the comm model refuses it (it divides the network bandwidth), so the penalty would vanish from
    every message and /readyz while the policy was accepted: the policy check says so instead."""
    text = HEAD + f"comm:\n  crossRackOversubscription: {value}\n"
    if error is None:
        policy = parse_policy_text(text)
        assert policy.comm.cross_rack_oversubscription == float(value)
        assert policy.comm.bandwidths().cross_rack_oversubscription == float(value)  # the model takes it
        return
    with pytest.raises(PolicyError) as info:
        parse_policy_text(text)
    assert info.value.errors == [error]


@pytest.mark.parametrize(("value", "ok"), [("0.001", True), ("0", False), ("-1", False), ("10000", True)])
def test_bandwidths_need_only_be_positive(value: str, ok: bool) -> None:
    """The other comm numbers keep the (0, maximum] range: only the oversubscription has a floor of 1."""
    text = HEAD + f"comm:\n  networkGbps: {value}\n"
    if ok:
        assert parse_policy_text(text).comm.network_gbps == float(value)
        return
    with pytest.raises(PolicyError) as info:
        parse_policy_text(text)
    assert info.value.errors == [f"comm.networkGbps (line 4): must be positive and at most 100000, got {value}"]
