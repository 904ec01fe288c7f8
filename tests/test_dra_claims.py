"""A pod's ResourceClaims read request by request (policies/dra.py `pod_claims`): counts, allocation modes,
GpuConfig and MigDeviceConfig sharing, which container each ask goes to, and malformed entries skipped without
hiding the good ones.
The golden cases in tests/cases/dra/ are the behaviour; these pin the parts mutation testing found loose."""

from __future__ import annotations

from typing import Any

from policies import dra
from policies.resources import GPU, GPU_SHARED, ContainerAsk

GPU_CLASS = "gpu.nvidia.com"
WHOLE_GPU = f"device.driver == '{GPU_CLASS}' && device.attributes['{GPU_CLASS}'].type == 'gpu'"
TIME_SLICING = {"driver": GPU_CLASS, "parameters": {"kind": "GpuConfig", "sharing": {"strategy": "TimeSlicing"}}}
MIG_MPS = {"driver": GPU_CLASS, "parameters": {"kind": "MigDeviceConfig", "sharing": {"strategy": "MPS"}}}


def _claims(requests: list[Any], config: Any = None, containers: Any = None, refs: Any = None) -> dra.PodClaims:
    """The claims of a pod whose claim `gpus` is the template `t` (in namespace ml) with these requests."""
    devices: dict[str, Any] = {"requests": requests}
    if config is not None:
        devices["config"] = config
    template = {"spec": {"spec": {"devices": devices}}}
    pod = {
        "spec": {
            "resourceClaims": refs or [{"name": "gpus", "resourceClaimTemplateName": "t"}],
            "containers": containers or [{"name": "c", "resources": {"claims": [{"name": "gpus"}]}}],
        }
    }
    found = {("ResourceClaimTemplate", "ml", "t"): template}
    return dra.pod_claims(pod, dra.Lookup(dra.Classes(), lambda k, ns, n: found.get((k, ns, n)), "ml"))


def _exactly(name: str, **body: Any) -> dict[str, Any]:
    return {"name": name, "exactly": {"deviceClassName": GPU_CLASS, **body}}


def test_allocation_mode_all_counts_no_devices_and_a_bad_count_counts_none() -> None:
    """`All` takes every matching device of one node, a number unknown here: 0, as for a count the API server
    refuses. A count of 0 stays 0; a missing one is ExactCount's default, 1."""
    read = _claims(
        [
            _exactly("all", allocationMode="All", count=4),
            _exactly("exact", allocationMode="ExactCount", count=3),
            _exactly("zero", count=0),
            _exactly("negative", count=-2),
            _exactly("text", count="2"),
            _exactly("default"),
        ]
    )
    assert [(a.request, a.count) for a in read.asks] == [
        ("all", 0),
        ("exact", 3),
        ("zero", 0),
        ("negative", 0),
        ("text", 0),
        ("default", 1),
    ]


def test_sharing_applies_by_request_by_parent_request_or_to_all() -> None:
    """A GpuConfig names requests, or (no `requests`) applies to all of the claim; a firstAvailable subrequest
    is shared when its parent request is named."""
    first = {"name": "gpus", "firstAvailable": [{"name": "any", "deviceClassName": GPU_CLASS}]}
    by_parent = _claims([first], [{"requests": ["gpus"], "opaque": TIME_SLICING}])
    assert [(a.request, a.resource, a.sharing) for a in by_parent.asks] == [("gpus/any", GPU_SHARED, "TimeSlicing")]
    to_all = _claims([_exactly("a"), _exactly("b")], [{"opaque": TIME_SLICING}])
    assert [(a.resource, a.sharing) for a in to_all.asks] == [(GPU_SHARED, "TimeSlicing")] * 2
    other = _claims([_exactly("a"), _exactly("b")], [{"requests": ["a"], "opaque": TIME_SLICING}])
    assert [(a.resource, a.sharing) for a in other.asks] == [(GPU_SHARED, "TimeSlicing"), (GPU, "")]


def test_sharing_skips_every_config_entry_it_cannot_read_and_reads_the_ones_after() -> None:
    good = {"requests": ["gpus"], "opaque": TIME_SLICING}
    config = [
        "junk",
        {"opaque": "junk"},
        {"opaque": {"driver": GPU_CLASS}},  # no parameters
        {"opaque": {"driver": "gpu.example.com", "parameters": TIME_SLICING["parameters"]}},  # another driver
        {"opaque": {"driver": GPU_CLASS, "parameters": {"kind": "Other", "sharing": {"strategy": "MPS"}}}},
        {"opaque": {"driver": GPU_CLASS, "parameters": {"kind": "GpuConfig", "sharing": {"strategy": "Exclusive"}}}},
        {"opaque": {"driver": GPU_CLASS, "parameters": {"kind": "GpuConfig", "sharing": {"strategy": 5}}}},
        good,
    ]
    assert dra._sharing(config) == {("gpu", "gpus"): "TimeSlicing"}
    # `requests` that is no list applies to all, like a missing one; an empty list too.
    for names in ("gpus", [], None):
        assert dra._sharing([{"requests": names, "opaque": TIME_SLICING}]) == {("gpu", ""): "TimeSlicing"}


def test_a_mig_device_is_shared_by_a_mig_device_config_and_a_whole_gpu_by_a_gpu_config_only() -> None:
    """The driver applies a GpuConfig to whole GPUs and a MigDeviceConfig to MIG devices: a config for all
    requests shares only the devices of its kind. A shared MIG device stays its profile (no shared resource)."""
    mig = {"name": "slice", "exactly": {"deviceClassName": "mig.nvidia.com", "selectors": [_profile("1g.10gb")]}}
    both = [_exactly("whole"), mig]
    by_gpu = _claims(both, [{"opaque": TIME_SLICING}])
    assert [(a.resource, a.sharing, a.config) for a in by_gpu.asks] == [
        (GPU_SHARED, "TimeSlicing", "GpuConfig"),
        ("nvidia.com/mig-1g.10gb", "", ""),
    ]
    by_mig = _claims(both, [{"opaque": MIG_MPS}])
    assert [(a.resource, a.sharing, a.config) for a in by_mig.asks] == [
        (GPU, "", ""),
        ("nvidia.com/mig-1g.10gb", "MPS", "MigDeviceConfig"),
    ]
    assert (
        by_mig.asks[1].describe()
        == "claim gpus request slice (1 x nvidia.com/mig-1g.10gb, MigDeviceConfig sharing MPS)"
    )
    named = _claims(both, [{"requests": ["slice"], "opaque": MIG_MPS}, {"requests": ["whole"], "opaque": TIME_SLICING}])
    assert [a.config for a in named.asks] == ["GpuConfig", "MigDeviceConfig"]
    assert dra._sharing([{"opaque": MIG_MPS}, {"requests": ["whole"], "opaque": TIME_SLICING}]) == {
        ("mig", ""): "MPS",
        ("gpu", "whole"): "TimeSlicing",
    }


def test_a_first_available_ask_takes_the_sharing_and_its_config_from_the_alternative_that_shares() -> None:
    """Judged as the first alternative, but shared when any alternative is: a whole GPU first, a MIG device
    shared by a MigDeviceConfig second, reads as the whole GPU with the MIG device's sharing and its config."""
    first = {
        "name": "gpus",
        "firstAvailable": [
            {"name": "whole", "deviceClassName": GPU_CLASS},
            {"name": "slice", "deviceClassName": "mig.nvidia.com", "selectors": [_profile("1g.10gb")]},
        ],
    }
    read = _claims([first], [{"requests": ["gpus/slice"], "opaque": MIG_MPS}])
    assert [(a.request, a.resource, a.sharing, a.config) for a in read.asks] == [
        ("gpus/whole", GPU, "MPS", "MigDeviceConfig")
    ]


def test_malformed_requests_are_skipped_and_every_error_is_kept() -> None:
    read = _claims(
        [
            "junk",
            {"name": "nobody"},  # neither exactly nor firstAvailable
            {"name": "sub", "firstAvailable": {"name": "x", "deviceClassName": GPU_CLASS}},  # not a list
            {"name": "noclass", "exactly": {}},  # the API server requires the class: nothing to judge, no error
            {"exactly": {"deviceClassName": GPU_CLASS, "count": 2}},  # no name
            {"name": "x", "exactly": {"deviceClassName": "nope.example.com"}},
            {"name": "y", "exactly": {"deviceClassName": "gone.example.com"}},
            _exactly("gpus", count=2),
        ]
    )
    assert [(a.request, a.count) for a in read.asks] == [("", 2), ("gpus", 2)]
    assert read.errors == (
        "claim gpus request x: DeviceClass nope.example.com does not exist",
        "claim gpus request y: DeviceClass gone.example.com does not exist",
    )


def test_a_claim_that_cannot_be_read_is_a_note_and_a_reference_to_nothing_is_silent() -> None:
    refs = [
        {"name": "direct", "resourceClaimName": "mine"},
        {"name": "bare"},  # names no claim nor template: the API server refuses it, nothing to say here
        {"name": "gpus", "resourceClaimTemplateName": "t"},
    ]
    read = _claims([_exactly("gpus")], refs=refs)
    assert read.notes == ("claim direct: ResourceClaim mine not found in namespace ml: its devices are not judged",)
    assert [a.claim for a in read.asks] == ["gpus"]
    pod = {"spec": {"resourceClaims": [{"name": "g", "resourceClaimTemplateName": "t"}]}}
    no_resolver = dra.pod_claims(pod, dra.Lookup(dra.Classes(), None, ""))
    assert no_resolver.notes == (
        "claim g: ResourceClaimTemplate t not found in namespace default: its devices are not judged",
    )


def test_a_claim_or_template_whose_spec_is_no_mapping_asks_nothing() -> None:
    refs = [{"name": "a", "resourceClaimName": "c"}, {"name": "b", "resourceClaimTemplateName": "t"}]
    pod = {"spec": {"resourceClaims": refs}}
    for claim, template in (({"spec": []}, {"spec": {"spec": "junk"}}), ({"spec": None}, {"spec": "junk"})):
        found = {("ResourceClaim", "ml", "c"): claim, ("ResourceClaimTemplate", "ml", "t"): template}
        read = dra.pod_claims(pod, dra.Lookup(dra.Classes(), lambda k, ns, n, f=found: f.get((k, ns, n)), "ml"))
        assert (read.asks, read.errors, read.notes) == ((), (), ())


def test_each_ask_goes_to_the_container_that_names_it_and_the_rest_to_the_first_app_container() -> None:
    requests = [
        _exactly("a"),
        {"name": "b", "firstAvailable": [{"name": "big", "deviceClassName": GPU_CLASS}]},
        _exactly("c"),
        _exactly("d"),
    ]
    containers = [
        "junk",
        {"name": "main", "resources": {"claims": [{"name": "other"}, {"name": "gpus", "request": "a"}]}},
        {"name": "side", "resources": {"claims": [{"name": "gpus", "request": "b"}, {"name": "gpus"}]}},
        {"resources": {"claims": [{"name": "gpus", "request": "c/x"}]}},  # no name: known by its index
    ]
    init = [{"name": "warmup", "resources": {"claims": [{"name": "gpus", "request": "d"}]}}]
    read = _claims(requests, containers=containers)
    index = {a.request: i for i, a in enumerate(read.asks)}
    assert dict(read.containers) == {"main": (index["a"],), "side": (index["b/big"], index["c"], index["d"])}
    with_init = dict(
        _claims(requests, containers=[*containers[:2], {"name": "idle"}]).containers  # nobody else names b, c, d
    )
    assert with_init == {"main": (index["a"], index["b/big"], index["c"], index["d"])}
    pod_init = _claims(requests, containers=[{"name": "app"}, containers[3]])
    assert dict(pod_init.containers) == {"#1": (index["c"],), "app": (index["a"], index["b/big"], index["d"])}
    parent = [{"name": "app"}, {"name": "sub", "resources": {"claims": [{"name": "gpus", "request": "b"}]}}]
    assert dict(_claims(requests, containers=parent).containers) == {  # "b" names its firstAvailable subrequest
        "sub": (index["b/big"],),
        "app": (index["a"], index["c"], index["d"]),
    }
    spec_init = {"initContainers": init, "containers": [{"name": "app"}]}
    by_claim = {"gpus": list(range(len(read.asks)))}
    assert dra._by_container(spec_init, by_claim, list(read.asks)) == {
        "warmup": (index["d"],),
        "app": (index["a"], index["b/big"], index["c"]),
    }
    assert dra._by_container({"containers": []}, by_claim, list(read.asks)) == {"#0": (0, 1, 2, 3)}


def test_an_extended_resource_reads_as_its_class_and_a_missing_class_is_an_error() -> None:
    assert dra.extended_ask(dra.EXTENDED_PREFIX + "mig.nvidia.com", dra.Classes()) == ("nvidia.com/mig", "")
    assert dra.extended_ask(dra.EXTENDED_PREFIX + GPU_CLASS, dra.Classes()) == (GPU, "")
    served = dra.classes_from_objects([])
    assert dra.extended_ask(dra.EXTENDED_PREFIX + "nope", served) == (
        "",
        f"{dra.EXTENDED_PREFIX}nope: DeviceClass nope does not exist",
    )
    assert dra.extended_ask("example.com/fpga", served) == (None, "")


def test_an_ask_is_described_with_its_sharing_only_when_shared() -> None:
    assert dra.ClaimAsk("gpus", "r", GPU, 2).describe() == "claim gpus request r (2 x nvidia.com/gpu)"
    shared = dra.ClaimAsk("gpus", "r", GPU_SHARED, 1, "MPS", config="GpuConfig").describe()
    assert shared == "claim gpus request r (1 x nvidia.com/gpu.shared, GpuConfig sharing MPS)"


def _ask(name: str, init: bool = False) -> ContainerAsk:
    return ContainerAsk(name, init, {}, (), ())


def test_every_claim_of_a_pod_is_read_past_those_it_cannot_read_and_indexes_stay_its_own() -> None:
    """Claims after a malformed reference or a missing object are still read; two claims' asks are numbered one
    after the other (each container gets its own claim's), and every claim's errors are kept."""
    found = {
        ("ResourceClaimTemplate", "ml", "one"): {"spec": {"spec": {"devices": {"requests": [_exactly("a", count=3)]}}}},
        ("ResourceClaimTemplate", "ml", "two"): {
            "spec": {
                "spec": {
                    "devices": {
                        "requests": [_exactly("b"), _exactly("c", count=2), _exactly("x", deviceClassName="nope")]
                    }
                }
            }
        },
        ("ResourceClaimTemplate", "ml", "bad"): {
            "spec": {"spec": {"devices": {"requests": [_exactly("y", deviceClassName="gone")]}}}
        },
    }
    pod = {
        "spec": {
            "resourceClaims": [
                "junk",
                {"name": "first", "resourceClaimTemplateName": "one"},
                {"name": "missing", "resourceClaimTemplateName": "absent"},
                {"name": "second", "resourceClaimTemplateName": "two"},
                {"name": "third", "resourceClaimTemplateName": "bad"},
            ],
            "containers": [
                {"name": "a", "resources": {"claims": [{"name": "first"}]}},
                {"name": "b", "resources": {"claims": [{"name": "second"}]}},
            ],
        }
    }
    read = dra.pod_claims(pod, dra.Lookup(dra.Classes(), lambda k, ns, n: found.get((k, ns, n)), "ml"))
    assert [(a.claim, a.request, a.count) for a in read.asks] == [
        ("first", "a", 3),
        ("second", "b", 1),
        ("second", "c", 2),
    ]
    assert dict(read.containers) == {"a": (0,), "b": (1, 2)}
    assert read.errors == (
        "claim second request x: DeviceClass nope does not exist",
        "claim third request y: DeviceClass gone does not exist",
    )
    assert len(read.notes) == 1 and read.notes[0].startswith("claim missing: ")
    assert dra.pod_claims({"spec": "junk"}, dra.Lookup(dra.Classes(), None, "ml")) == dra.PodClaims()


def test_claimed_devices_add_up_per_container_and_a_class_that_does_not_exist_is_an_error_not_a_device() -> None:
    served = dra.classes_from_objects(
        [
            {
                "metadata": {"name": n},
                "spec": {"selectors": [{"cel": {"expression": WHOLE_GPU}}]},
            }
            for n in ("a", "b")
        ]
        + [{"metadata": {"name": "gpu.nvidia.com"}, "spec": {}}]
    )
    two_requests = _exactly("r1"), {"name": "r2", "exactly": {"deviceClassName": GPU_CLASS, "count": 2}}
    found = {("ResourceClaimTemplate", "ml", "t"): {"spec": {"spec": {"devices": {"requests": list(two_requests)}}}}}
    p = dra.EXTENDED_PREFIX
    pod = {
        "spec": {
            "resourceClaims": [{"name": "gpus", "resourceClaimTemplateName": "t"}],
            "initContainers": [{"name": "warm", "resources": {"limits": {p + "a": "1"}}}],
            "containers": [
                "junk",
                {"name": "main", "resources": {"claims": [{"name": "gpus"}]}},
                {"name": "side", "resources": {"limits": {"nvidia.com/gpu": 1, p + "a": 1, p + "b": "2", 5: 1}}},
                {"name": "lost", "resources": {"limits": {p + "nope": 2}}},
                {"name": "gone", "resources": {"requests": {p + "gone": 1}}},
                {"name": "odd", "resources": "junk"},
                {"resources": {"limits": {p + "a": 4}}},
            ],
        }
    }
    lookup = dra.Lookup(served, lambda k, ns, n: found.get((k, ns, n)), "ml")
    asks = [_ask("warm", True), _ask("main"), _ask("side"), _ask("lost"), _ask("gone"), _ask("odd"), _ask("#6")]
    out, claims = dra.with_claims(pod, asks, lookup)
    assert {c.name: dict(c.claimed) for c in out if c.claimed} == {
        "warm": {GPU: 1},
        "main": {GPU: 3},
        "side": {GPU: 3},
        "#6": {GPU: 4},
    }
    assert claims is not None and claims.errors == (
        f"container lost: {p}nope: DeviceClass nope does not exist",
        f"container gone: {p}gone: DeviceClass gone does not exist",
    )


def test_a_pod_asking_nothing_through_dra_is_not_read_and_a_claim_of_no_gpus_still_is() -> None:
    plain = {"spec": {"containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": 1}}}]}}
    lookup = dra.Lookup(dra.Classes(), None, "ml")
    assert dra.with_claims(plain, [_ask("c")], lookup) == ([_ask("c")], None)
    assert dra.with_claims({"spec": "junk"}, [], lookup) == ([], None)
    channel = [{"name": "ch", "exactly": {"deviceClassName": "compute-domain-default-channel.nvidia.com"}}]
    read = _claims(channel)
    assert [(a.resource, a.channel) for a in read.asks] == [("", True)]
    template = {"spec": {"spec": {"devices": {"requests": channel}}}}
    pod = {
        "spec": {"resourceClaims": [{"name": "gpus", "resourceClaimTemplateName": "t"}], "containers": [{"name": "c"}]}
    }
    out, claims = dra.with_claims(pod, [_ask("c")], dra.Lookup(dra.Classes(), lambda *k: template, "ml"))
    assert out == [_ask("c")] and claims is not None and len(claims.asks) == 1


def _profile(name: str) -> dict[str, Any]:
    return {"cel": {"expression": f"device.attributes['{GPU_CLASS}'].profile == '{name}'"}}
