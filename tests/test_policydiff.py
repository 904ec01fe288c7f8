"""`policies.policydiff.describe_changes`: the lines `gpu-admission policy diff` prints, checked whole and in order.

tests/test_check_cli.py runs the command as a user does (a subprocess); these call the function, so mutation
testing sees them, and pin every verb, every setting's label and how unset values and non-strings are shown.
"""

from __future__ import annotations

import copy
import dataclasses
from typing import Any

import yaml

from policies.document import Policy, compile_policy, default_policy_text
from policies.policydiff import _SETTINGS, describe_changes

DEFAULT_DOC: dict[str, Any] = yaml.safe_load(default_policy_text())


def policy(**edits: Any) -> Policy:
    """The default policy with top-level sections merged one level deep (`rules={...}` edits some rules)."""
    doc = copy.deepcopy(DEFAULT_DOC)
    for key, value in edits.items():
        if isinstance(value, dict) and isinstance(doc.get(key), dict):
            doc[key].update(value)
        else:
            doc[key] = value
    return compile_policy(doc)


def pool(name: str, gpus: int = 8) -> dict[str, Any]:
    return {"name": name, "nodeSelector": {"pool": name}, "gpusPerNode": gpus}


def test_the_same_policy_changes_nothing() -> None:
    assert describe_changes(policy(), policy()) == []


def test_each_rule_is_switched_off_switched_on_or_changed_in_the_new_policy_order() -> None:
    old = policy(rules={"training-same-rack": "off", "training-queue-priority": "warn", "dra-claims": "enforce"})
    new = policy(rules={"training-same-rack": "enforce", "training-queue-priority": "enforce", "dra-claims": "off"})
    assert describe_changes(old, new) == [
        "rule training-same-rack: switched on (off -> enforce)",
        "rule training-queue-priority: changed (warn -> enforce)",
        "rule dra-claims: switched off (enforce -> off)",
    ]
    # off -> audit is switched on too; audit -> warn, neither side off, is a change.
    old = policy(rules={"training-same-rack": "off", "shared-gpu-single": "audit"})
    new = policy(rules={"training-same-rack": "audit", "shared-gpu-single": "warn"})
    assert describe_changes(old, new) == [
        "rule training-same-rack: switched on (off -> audit)",
        "rule shared-gpu-single: changed (audit -> warn)",
    ]


def test_mutations_are_switched_on_or_off() -> None:
    old = policy(mutations={"training-pool": False, "gpu-slice": True})
    new = policy(mutations={"training-pool": True, "gpu-slice": False})
    assert describe_changes(old, new) == ["mutation training-pool: switched on", "mutation gpu-slice: switched off"]


def test_pools_added_removed_and_changed_each_sorted_by_name() -> None:
    old = policy(pools=[pool("kept"), pool("resized"), pool("z-gone"), pool("a-gone")])
    new = policy(pools=[pool("z-new"), pool("resized", gpus=4), pool("a-new"), pool("kept")])
    assert describe_changes(old, new) == [
        "pool a-new: added",
        "pool z-new: added",
        "pool a-gone: removed",
        "pool z-gone: removed",
        "pool resized: changed",
    ]


def test_every_setting_is_named_by_its_document_path_with_unset_and_non_string_values_shown() -> None:
    toleration = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
    old = policy()
    new = policy(
        failureMode="open",
        defaultEnforcement="warn",
        topology={"rack": "topology.kubernetes.io/rack"},
        pools=[pool("h100")],
        training={
            "pool": "h100",
            "schedulerName": "volcano",
            "queue": {"system": "volcano", "name": "research"},
            "priorityClassName": "training-high",
        },
        inference={"warmPool": 2, "spread": {"whenUnsatisfiable": "DoNotSchedule", "zones": False}},
        gpuNodes={"tolerations": [toleration]},
        comm={"networkGbps": 400},
    )
    tolerations = repr(new.tolerations)
    assert tolerations.startswith("(Toleration(key='nvidia.com/gpu'")
    assert describe_changes(old, new) == [
        "pool h100: added",
        "failureMode: closed -> open",
        "defaultEnforcement: enforce -> warn",
        "topology.rack: auto -> topology.kubernetes.io/rack",
        "training.pool: (unset) -> h100",
        "training.schedulerName: (unset) -> volcano",
        "training.queue.system: (unset) -> volcano",
        "training.queue.name: (unset) -> research",
        "training.priorityClassName: (unset) -> training-high",
        "inference.warmPool: 1 -> 2",
        "inference.spread.whenUnsatisfiable: ScheduleAnyway -> DoNotSchedule",
        "inference.spread.zones: True -> False",
        f"gpuNodes.tolerations: (unset) -> {tolerations}",
        f"comm: {old.comm!r} -> {new.comm!r}",
    ]
    # Back again: the unset side is the new one.
    back = describe_changes(new, old)
    assert f"gpuNodes.tolerations: {tolerations} -> (unset)" in back
    assert "training.schedulerName: volcano -> (unset)" in back
    assert "inference.warmPool: 2 -> 1" in back


def test_a_value_that_is_only_falsy_is_shown_not_unset() -> None:
    """Only "" and () read as unset: a warm pool of 0 (inference.warmPool's lowest) is shown as 0."""
    assert describe_changes(policy(), policy(inference={"warmPool": 0})) == ["inference.warmPool: 1 -> 0"]


def test_placement_levels_and_topology_schedulers_are_changes_too() -> None:
    """These change verdicts (`whenNoDomainFits: deny` denies what `prefer` allowed), so `policy diff` must not
    call such an edit "no change in behaviour" (it did before session 10)."""
    old = policy()
    new = policy(
        topology={"levels": ["topology.kubernetes.io/rack", "topology.kubernetes.io/zone"]},
        training={"topologySchedulers": ["volcano"]},
        placement={
            "whenNoDomainFits": "deny",
            "reservationSeconds": 60,
            "noPodsGraceSeconds": 5,
            "waitingGraceSeconds": 10,
            "gangSchedulers": {"kueue": True, "volcano": True, "kaiTopology": "gpu-topology", "workload": True},
        },
    )
    assert describe_changes(old, new) == [
        "topology.levels: (unset) -> ('topology.kubernetes.io/rack', 'topology.kubernetes.io/zone')",
        "training.topologySchedulers: ('kai-scheduler', 'volcano') -> ('volcano',)",
        "placement.whenNoDomainFits: prefer -> deny",
        "placement.reservationSeconds: 120.0 -> 60.0",
        "placement.noPodsGraceSeconds: 15.0 -> 5.0",
        "placement.waitingGraceSeconds: 30.0 -> 10.0",
        "placement.gangSchedulers.kueue: False -> True",
        "placement.gangSchedulers.volcano: False -> True",
        "placement.gangSchedulers.kaiTopology: (unset) -> gpu-topology",
        "placement.gangSchedulers.workload: False -> True",
    ]
    assert describe_changes(old, policy(training={"topologySchedulers": []})) == [
        "training.topologySchedulers: ('kai-scheduler', 'volcano') -> (unset)"
    ]


def test_every_setting_of_a_policy_is_compared() -> None:
    """A setting added to Policy but not to the diff would be an edit `policy diff` calls no change."""
    compared = {attr for attr, _ in _SETTINGS} | {"rules", "mutations", "pools"}
    assert {f.name for f in dataclasses.fields(Policy)} - {"hash", "document"} == compared
