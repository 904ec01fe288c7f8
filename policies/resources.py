"""What GPU resources a pod asks for, read from its containers' limits and requests.

Extended resources are whole integers set in `limits`; a request, if given, must equal the limit
(gpu-resources.md §1). The summary keeps the raw facts (what was asked, what did not parse, where request and
limit differ) and leaves judging them to the rules.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from policies.workloads import Json

if TYPE_CHECKING:
    from policies.dra import ClaimAsk, Lookup, PodClaims

GPU = "nvidia.com/gpu"
# DRA's implicit extended resource of a DeviceClass: deviceclass.resource.kubernetes.io/<class> (policies/dra.py).
EXTENDED_PREFIX = "deviceclass.resource.kubernetes.io/"
GPU_SHARED = "nvidia.com/gpu.shared"
NVIDIA_PREFIX = "nvidia.com/"
# HAMi's own resources are not device-plugin GPUs; they count as a GPU ask but not as whole cards.
HAMI_RESOURCES = frozenset({"nvidia.com/gpumem", "nvidia.com/gpumem-percentage", "nvidia.com/gpucores"})


def is_gpu_resource(name: str) -> bool:
    return name.startswith(NVIDIA_PREFIX)


def is_shared(name: str) -> bool:
    """A time-sliced / MPS resource advertised under a renamed name (renameByDefault: true)."""
    return name.startswith(NVIDIA_PREFIX) and name.endswith(".shared")


def is_mig(name: str) -> bool:
    return name.startswith("nvidia.com/mig-")


NOTHING: Mapping[str, int] = MappingProxyType({})  # one shared empty mapping: most containers claim nothing


@dataclass(frozen=True)
class ContainerAsk:
    """The nvidia.com/* resources of one container (values from limits, else requests)."""

    name: str
    init: bool
    amounts: Mapping[str, int]
    unparsable: tuple[str, ...]
    mismatched: tuple[str, ...]
    # Devices asked through DRA (claims, or extended resources a DeviceClass serves), as the device-plugin
    # resource they amount to (policies/dra.py). Kept apart from `amounts`: the limits rules (whole numbers,
    # request == limit, one shared unit) are about what the user wrote in limits.
    claimed: Mapping[str, int] = field(default_factory=lambda: NOTHING)

    def total(self, name: str) -> int:
        return self.amounts.get(name, 0) + self.claimed.get(name, 0)


@dataclass(frozen=True)
class PodAsk:
    containers: tuple[ContainerAsk, ...]
    whole_gpus: int  # nvidia.com/gpu per pod: sum over containers, or the largest init container if larger
    # Any GPU asked: a container's nvidia.com/ amount (or one that does not parse), a device through DRA, or
    # a claim that could not be read (pod_ask works it out once: rules and mutations ask it several times).
    asks_gpu: bool
    claims: PodClaims | None = None  # the pod's DRA claims as read (None: it has none, or none were read)

    def resource_names(self) -> set[str]:
        return {name for c in self.containers for name in (*c.amounts, *c.claimed)}

    def claim_asks(self) -> tuple[ClaimAsk, ...]:
        return self.claims.asks if self.claims is not None else ()

    def units(self) -> dict[str, int]:
        """Units of each GPU resource the pod holds on its node: the app containers' sum, or the largest
        init container's when larger (as the scheduler counts a pod's request)."""
        out: dict[str, int] = {}
        for name in self.resource_names():
            app = sum(c.total(name) for c in self.containers if not c.init)
            init = max((c.total(name) for c in self.containers if c.init), default=0)
            out[name] = max(app, init)
        return out


def parse_count(value: Any) -> int | None:
    """An extended-resource amount: a whole, non-negative integer (as int or decimal string)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value if value >= 0 else None
    if isinstance(value, str) and value.isascii() and value.isdigit():
        return int(value)
    if isinstance(value, float) and value.is_integer() and value >= 0:
        return int(value)
    return None


def _resource_map(resources: Any, key: str) -> Mapping[str, Any]:
    if not isinstance(resources, dict):
        return {}
    value = resources.get(key)
    return value if isinstance(value, dict) else {}


def _container_ask(container: Json, init: bool, index: int, mapped: frozenset[str]) -> tuple[ContainerAsk, bool]:
    """The container's ask, and whether it names a resource served through DRA (`EXTENDED_PREFIX`, or one of
    `mapped`, the classes' extendedResourceNames): read in the same pass, the cheap test before claims."""
    res = container.get("resources")
    limits = _resource_map(res, "limits")
    requests = _resource_map(res, "requests")
    amounts: dict[str, int] = {}
    bad: list[str] = []
    mismatched: list[str] = []
    through_dra = False
    names = list(limits)
    if requests:
        names += [k for k in requests if k not in limits]  # limits win; a request alone counts
    for name in names:
        if not isinstance(name, str):
            continue
        if not name.startswith(NVIDIA_PREFIX):
            through_dra = through_dra or name.startswith(EXTENDED_PREFIX) or name in mapped
            continue
        raw = limits[name] if name in limits else requests[name]
        count = parse_count(raw)
        if count is None:
            bad.append(name)
            continue
        if name not in limits or (name in requests and _differs(requests[name], raw, count)):
            mismatched.append(name)
        if count:
            amounts[name] = count
    cname = container.get("name")
    ask = ContainerAsk(
        name=cname if isinstance(cname, str) else f"#{index}",
        init=init,
        amounts=amounts,
        unparsable=tuple(sorted(bad)) if bad else (),
        mismatched=tuple(sorted(mismatched)) if mismatched else (),
    )
    return ask, through_dra


def _differs(request: Any, limit: Any, count: int) -> bool:
    """The request is another amount than the limit's `count` (the same value of the same type is not: the
    API server sends both as equal strings)."""
    if type(request) is type(limit) and request == limit:
        return False
    return parse_count(request) != count


def pod_ask(pod: Json, lookup: Lookup | None = None) -> PodAsk:
    """The pod's GPU ask; with a DRA lookup also what its claims and DRA extended resources ask."""
    spec = pod.get("spec")
    out: list[ContainerAsk] = []
    mapped = lookup.classes.extended_names if lookup is not None else frozenset()
    through_dra = False
    if isinstance(spec, dict):
        for key, init in (("initContainers", True), ("containers", False)):
            items = spec.get(key)
            if isinstance(items, list):
                for i, c in enumerate(items):
                    if isinstance(c, dict):
                        ask, dra_name = _container_ask(c, init, i, mapped)
                        out.append(ask)
                        through_dra = through_dra or dra_name
    claims = None
    if lookup is not None and isinstance(spec, dict) and (through_dra or spec.get("resourceClaims")):
        out, claims = lookup.with_claims(pod, out)
    app = init_max = 0
    asks = bool(claims and (claims.errors or claims.notes))
    for c in out:
        n = c.amounts.get(GPU, 0) + c.claimed.get(GPU, 0)
        if c.init:
            init_max = max(init_max, n)
        else:
            app += n
        asks = asks or bool(c.amounts or c.unparsable or c.claimed)
    return PodAsk(containers=tuple(out), whole_gpus=max(app, init_max), asks_gpu=asks, claims=claims)
