"""GPUs held through ResourceClaims: what an allocated claim holds and on which node (policies/dra.claim_held),
the claim cut down as the server caches it (cluster/dra.slim_claim), and the pod view counting claims beside
pods (cluster/pods.PodView.apply_claim). The e2e proof is tests/e2e/test_dra_e2e.py (the real scheduler's
allocations steer the webhook's rack choice)."""

from __future__ import annotations

import copy
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from cluster.dra import slim_claim
from cluster.pods import PodView
from cluster.reflector import Change
from policies import dra
from policies.resources import GPU, GPU_SHARED
from policies.subject import pod_facts
from tests.test_placement import bound_pod

CLASSES = dra.Classes()  # the NVIDIA driver's built-in classes


def node_selector(node: str) -> dict[str, Any]:
    """The scheduler's nodeSelector of a node-local allocation (dynamic-resource-allocation allocator)."""
    return {"nodeSelectorTerms": [{"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}]}


def claim(
    name: str,
    node: str | None,
    results: list[str],
    requests: list[dict[str, Any]] | None = None,
    config: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """A ResourceClaim as the API server stores it once the scheduler allocated `results` (request names)."""
    reqs = requests or [{"name": "gpus", "exactly": {"deviceClassName": "gpu.nvidia.com", "count": len(results)}}]
    obj: dict[str, Any] = {
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": "ml", "resourceVersion": "1", "managedFields": [{"x": 1}]},
        "spec": {"devices": {"requests": reqs, **({"config": config} if config else {})}},
    }
    if node is not None:
        obj["status"] = {
            "allocation": {
                "devices": {
                    "results": [
                        {"request": r, "driver": "gpu.nvidia.com", "pool": node, "device": f"gpu-{i}"}
                        for i, r in enumerate(results)
                    ]
                },
                "nodeSelector": node_selector(node),
            },
            "reservedFor": [{"resource": "pods", "name": "p", "uid": "u"}],
        }
    return obj


def held(obj: dict[str, Any]) -> tuple[str, dict[str, int]]:
    return dra.claim_held(obj, CLASSES)


# -- what a claim holds ---------------------------------------------------------------------------------------


def test_an_allocated_claim_holds_one_unit_per_device_on_its_node() -> None:
    assert held(claim("c", "dra-a-1", ["gpus"] * 8)) == ("dra-a-1", {GPU: 8})


def test_a_claim_not_allocated_yet_holds_nothing() -> None:
    assert held(claim("c", None, ["gpus"] * 8)) == ("", {})


def test_first_available_counts_the_subrequest_the_scheduler_gave() -> None:
    """firstAvailable: results name "request/subrequest"; the fallback given (a MIG slice) is what is held."""
    reqs = [
        {
            "name": "gpu",
            "firstAvailable": [
                {"name": "whole", "deviceClassName": "gpu.nvidia.com"},
                {
                    "name": "slice",
                    "deviceClassName": "mig.nvidia.com",
                    "selectors": [{"cel": {"expression": "device.attributes['gpu.nvidia.com'].profile == '1g.10gb'"}}],
                },
            ],
        }
    ]
    assert held(claim("c", "dra-mig-1", ["gpu/slice"], reqs)) == ("dra-mig-1", {"nvidia.com/mig-1g.10gb": 1})
    assert held(claim("c", "dra-mig-1", ["gpu/whole"], reqs)) == ("dra-mig-1", {GPU: 1})


def test_a_shared_claim_holds_shared_units() -> None:
    params = {"apiVersion": "resource.nvidia.com/v1beta1", "kind": "GpuConfig", "sharing": {"strategy": "MPS"}}
    config = [{"requests": ["gpus"], "opaque": {"driver": "gpu.nvidia.com", "parameters": params}}]
    assert held(claim("c", "n", ["gpus"], config=config)) == ("n", {GPU_SHARED: 1})


def test_the_schedulers_extended_resource_claim_is_not_counted_twice() -> None:
    """Its devices are the pod's nvidia.com/gpu limit, which the pod entry counts already."""
    obj = claim("p-extended-resources-x", "n", ["container-0-request-0"] * 2, [
        {"name": "container-0-request-0", "exactly": {"deviceClassName": "gpu.nvidia.com", "count": 2}}
    ])  # fmt: skip
    assert held(obj) == ("n", {GPU: 2})
    obj["metadata"]["annotations"] = {dra.EXTENDED_CLAIM_ANNOTATION: "true"}
    assert held(obj) == ("", {})


def test_devices_of_unknown_classes_channels_and_other_nodes_shapes_hold_no_gpu() -> None:
    reqs = [
        {"name": "gpus", "exactly": {"deviceClassName": "nope.example.com"}},
        {"name": "channel", "exactly": {"deviceClassName": "compute-domain-default-channel.nvidia.com"}},
    ]
    assert held(claim("c", "n", ["gpus", "channel", "missing"], reqs)) == ("n", {})
    network = claim("c", "n", ["gpus"])
    network["status"]["allocation"]["nodeSelector"] = {
        "nodeSelectorTerms": [{"matchExpressions": [{"key": "rack", "operator": "In", "values": ["a"]}]}]
    }
    assert held(network) == ("", {GPU: 1})  # network-attached: on no single node
    two = claim("c", "n", ["gpus"])
    two["status"]["allocation"]["nodeSelector"]["nodeSelectorTerms"][0]["matchFields"][0]["values"] = ["a", "b"]
    assert held(two)[0] == ""


def test_garbage_claims_hold_nothing_and_never_raise() -> None:
    for status in ("x", {"allocation": "x"}, {"allocation": {"devices": {"results": "x"}}}):
        obj = claim("c", "n", ["gpus"])
        obj["status"] = status
        assert held(obj) == ("", {})
    obj = claim("c", "n", ["gpus", 3, {"request": 4}])  # type: ignore[list-item]
    assert held(obj)[1] == {GPU: 1}


# -- the claim as the server caches it ----------------------------------------------------------------------


def test_slim_claim_keeps_spec_allocation_requests_and_node_only() -> None:
    full = claim("c", "dra-a-1", ["gpus"] * 2)
    full["metadata"]["annotations"] = {"kubectl.kubernetes.io/last-applied-configuration": "{...}"}
    slim = slim_claim(full)
    assert slim is not None
    assert slim["metadata"] == {"name": "c", "namespace": "ml", "resourceVersion": "1"}
    assert slim["status"] == {
        "allocation": {"devices": {"results": [{"request": "gpus"}] * 2}, "nodeSelector": node_selector("dra-a-1")}
    }
    assert held(slim) == held(full) == ("dra-a-1", {GPU: 2})
    full["metadata"]["annotations"][dra.EXTENDED_CLAIM_ANNOTATION] = "true"
    assert slim_claim(full)["metadata"]["annotations"] == {dra.EXTENDED_CLAIM_ANNOTATION: "true"}  # type: ignore[index]
    assert "status" not in slim_claim(claim("c", None, ["gpus"]))  # type: ignore[operator]


# -- the pod view ------------------------------------------------------------------------------------------


def view() -> PodView:
    return PodView(pod_facts, read_claim=held)


def test_the_pod_view_counts_allocated_claims_on_their_node() -> None:
    v = view()
    v.apply_claim(Change("ADDED", "ml/c", None, claim("c", None, ["gpus"] * 8)))
    assert v.snapshot().used_of(GPU) == {} and v.snapshot().claims == 0  # pending: not allocated yet
    v.apply_claim(Change("MODIFIED", "ml/c", None, claim("c", "dra-a-1", ["gpus"] * 8)))
    v.apply(Change("ADDED", "ml/p", None, bound_pod("p", "dra-a-2", 2)))  # a device-plugin pod beside it
    snap = v.snapshot()
    assert dict(snap.used_of(GPU)) == {"dra-a-1": 8, "dra-a-2": 2} and snap.claims == 1 and snap.pods == 1
    v.apply_claim(Change("DELETED", "ml/c", None, None))
    assert dict(v.snapshot().used_of(GPU)) == {"dra-a-2": 2} and v.snapshot().claims == 0


def test_a_garbage_claim_is_counted_as_skipped_and_forgets_what_the_key_held() -> None:
    v = view()
    v.apply_claim(Change("ADDED", "ml/c", None, claim("c", "n", ["gpus"])))
    v.apply_claim(Change("MODIFIED", "ml/c", None, "garbage"))
    assert v.snapshot().used_of(GPU) == {} and v.snapshot().skipped == 1


def test_without_a_claim_reader_claims_change_nothing() -> None:
    v = PodView(pod_facts)
    v.apply_claim(Change("ADDED", "ml/c", None, claim("c", "n", ["gpus"])))
    assert v.snapshot().used_of(GPU) == {} and v.snapshot().version == 0


def test_a_pod_with_claims_and_no_gpu_limit_is_kept_for_its_job() -> None:
    """Its devices are the claim's; the pod says which job is bound where (a gang's later pods follow it)."""
    p = bound_pod("w0", "dra-a-1", 0, job_name="llama")
    p["spec"]["containers"][0]["resources"] = {"claims": [{"name": "gpus"}]}
    p["spec"]["resourceClaims"] = [{"name": "gpus", "resourceClaimTemplateName": "gpus-llama"}]
    bound: list[str] = []
    v = PodView(pod_facts, on_bound=bound.append, read_claim=held)
    v.apply(Change("ADDED", "ml/w0", None, p))
    snap = v.snapshot()
    assert snap.pods == 1 and snap.used_of(GPU) == {}
    assert dict(snap.jobs) == {"ml-research/batch.kubernetes.io/job-name=llama": {"dra-a-1": 1}} and len(bound) == 1
    plain = copy.deepcopy(p)
    del plain["spec"]["resourceClaims"]
    v.apply(Change("MODIFIED", "ml/w0", None, plain))  # no claims, no GPUs: not kept
    assert v.snapshot().pods == 0


NODES = st.sampled_from(["n1", "n2", "n3"])
CLAIMS = st.sampled_from(["ml/a", "ml/b", "ml/c", "ml/d"])
OBJECT = st.one_of(
    st.none(),
    st.just("garbage"),
    st.builds(lambda node, k: claim("x", node, ["gpus"] * k), st.one_of(st.none(), NODES), st.integers(0, 8)),
)


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(CLAIMS, OBJECT), max_size=30))
def test_the_counts_are_those_of_the_claims_present_whatever_the_order(changes: list[tuple[str, Any]]) -> None:
    v = view()
    last: dict[str, Any] = {}
    for key, obj in changes:
        kind = "DELETED" if obj is None else "MODIFIED"
        v.apply_claim(Change(kind, key, None, obj))
        last[key] = obj
    want: dict[str, int] = {}
    for obj in last.values():
        if isinstance(obj, dict):
            node, units = held(obj)
            if node and units.get(GPU):
                want[node] = want.get(node, 0) + units[GPU]
    assert dict(v.snapshot().used_of(GPU)) == want


# -- every shape of claim gives an answer (mutation testing: each guard below is needed) -----------------------


def _with(path: list[Any], value: Any) -> dict[str, Any]:
    """A 2-GPU allocated claim with the value at `path` replaced."""
    obj = claim("c", "n", ["gpus", "gpus"])
    target: Any = obj
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    return obj


GARBAGE = [
    (["metadata"], ["x"]),
    (["spec"], ["x"]),
    (["spec", "devices"], ["x"]),
    (["spec", "devices", "requests"], "x"),
    (["spec", "devices", "requests", 0], "x"),
    (["spec", "devices", "requests", 0, "exactly", "deviceClassName"], 7),
    (["spec", "devices", "requests", 0, "exactly", "deviceClassName"], ["gpu.nvidia.com"]),  # unhashable
    (["status", "allocation", "devices"], ["x"]),
    (["status", "allocation", "devices", "results"], "xx"),
    (["status", "allocation", "devices", "results", 0], "x"),
    (["status", "allocation", "nodeSelector", "nodeSelectorTerms", 0], "x"),
]


def test_garbage_anywhere_in_a_claim_gives_an_answer_not_an_exception() -> None:
    for path, value in GARBAGE:
        node, units = held(_with(path, value))
        assert node in ("", "n") and set(units) <= {GPU}, (path, value)
        assert units.get(GPU, 0) <= 2, (path, value)


def test_one_bad_result_or_request_does_not_stop_the_others_from_counting() -> None:
    assert held(_with(["status", "allocation", "devices", "results", 0], "x")) == ("n", {GPU: 1})
    obj = claim("c", "n", ["nothing", "gpus"], [
        {"exactly": {"deviceClassName": "gpu.nvidia.com"}},  # no name: skipped, the next is read
        {"name": "nothing", "exactly": {"deviceClassName": "nope.example.com"}},
        {"name": "gpus", "exactly": {"deviceClassName": "gpu.nvidia.com"}},
    ])  # fmt: skip
    assert held(obj) == ("n", {GPU: 1})
    fields = obj["status"]["allocation"]["nodeSelector"]["nodeSelectorTerms"][0]["matchFields"]
    fields.insert(0, {"key": "metadata.name", "operator": "NotIn", "values": ["m"]})
    fields.insert(0, {"key": "spec.other", "operator": "In", "values": ["m"]})
    assert held(obj)[0] == "n"  # only a metadata.name In term names the node


def test_a_firstavailable_subrequest_without_a_name_is_skipped() -> None:
    reqs = [{"name": "gpu", "firstAvailable": [{"deviceClassName": "gpu.nvidia.com"}, "x",
                                              {"name": "one", "deviceClassName": "gpu.nvidia.com"}]}]  # fmt: skip
    assert held(claim("c", "n", ["gpu/one"], reqs)) == ("n", {GPU: 1})


def test_sharing_config_for_all_requests_the_request_or_the_chosen_subrequest() -> None:
    params = {"apiVersion": "resource.nvidia.com/v1beta1", "kind": "GpuConfig", "sharing": {"strategy": "TimeSlicing"}}
    reqs = [{"name": "gpu", "firstAvailable": [{"name": "whole", "deviceClassName": "gpu.nvidia.com"}]}]
    for names in ([], ["gpu"], ["gpu/whole"]):  # no requests: the whole claim; the request; its subrequest
        config = [
            {**({"requests": names} if names else {}), "opaque": {"driver": "gpu.nvidia.com", "parameters": params}}
        ]
        assert held(claim("c", "n", ["gpu/whole"], reqs, config)) == ("n", {GPU_SHARED: 1}), names
    other = [{"requests": ["gpu/other"], "opaque": {"driver": "gpu.nvidia.com", "parameters": params}}]
    assert held(claim("c", "n", ["gpu/whole"], reqs, other)) == ("n", {GPU: 1})


def test_a_held_whole_gpu_is_shared_by_a_gpu_config_only() -> None:
    """The driver applies a MigDeviceConfig to MIG devices only: one for all requests leaves a whole GPU whole."""
    for kind, resource in (("MigDeviceConfig", GPU), ("GpuConfig", GPU_SHARED)):
        params = {"apiVersion": "resource.nvidia.com/v1beta1", "kind": kind, "sharing": {"strategy": "MPS"}}
        config = [{"opaque": {"driver": "gpu.nvidia.com", "parameters": params}}]
        assert held(claim("c", "n", ["gpus"], config=config)) == ("n", {resource: 1}), kind


def test_no_more_results_are_read_than_the_bound() -> None:
    assert held(claim("c", "n", ["gpus"] * (dra.MAX_REQUESTS * 128 + 5))) == ("n", {GPU: dra.MAX_REQUESTS * 128})


# -- memory asked through capacity.requests -----------------------------------------------------------------


def _memory(body: dict[str, Any]) -> int | None:
    reqs = [{"name": "g", "exactly": {"deviceClassName": "gpu.nvidia.com", **body}}]
    pod = {"spec": {"resourceClaims": [{"name": "c", "resourceClaimName": "c"}], "containers": [{"name": "m"}]}}
    lookup = dra.Lookup(CLASSES, lambda kind, ns, name: {"spec": {"devices": {"requests": reqs}}}, "ml")
    (ask,) = dra.pod_claims(pod, lookup).asks
    return ask.memory


def test_capacity_requests_ask_memory_like_a_cel_selector_and_the_larger_wins() -> None:
    gib = 1 << 30
    cel = [{"cel": {"expression": "device.capacity['gpu.nvidia.com'].memory.compareTo(quantity('141Gi')) >= 0"}}]
    assert _memory({"capacity": {"requests": {"memory": "40Gi"}}}) == 40 * gib
    assert _memory({"capacity": {"requests": {"gpu.nvidia.com/memory": "40Gi"}}}) == 40 * gib
    assert _memory({"selectors": cel, "capacity": {"requests": {"memory": "40Gi"}}}) == 141 * gib
    assert _memory({"capacity": {"requests": {"memory": "80Gi", "gpu.nvidia.com/memory": "40Gi"}}}) == 80 * gib
    bad = [{"cel": {"expression": "device.capacity['gpu.nvidia.com'].memory.compareTo(quantity('lots')) >= 0"}}]
    assert _memory({"selectors": bad, "capacity": {"requests": {"memory": "40Gi"}}}) == 40 * gib
    for value in (True, ["40Gi"], {"x": 1}, "lots"):
        assert _memory({"capacity": {"requests": {"memory": value}}}) is None, value
    assert _memory({"capacity": {"requests": {"memory": 1024}}}) == 1024
    assert _memory({"capacity": "x"}) is None
