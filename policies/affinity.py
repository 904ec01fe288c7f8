"""gpulabels' whole-card and not-shared node-affinity expressions, computed over a NodeIndex.

`gpulabels.whole_card_expressions` / `not_shared_expressions` read the labels of every live GPU node: once per
inventory that is fine at 100 nodes, but a version per batch of Node events at 50,000 nodes would rescan them
all. Here the same questions are set operations on the index ("does any non-whole-card node carry
gke-gpu-partition-size?" is a mask AND), so a version costs what its label keys and values number, not its
nodes. tests/test_affinity.py checks the answers against gpulabels' on the fixture clusters and random ones.
"""

from __future__ import annotations

from dataclasses import dataclass

from policies import gpulabels
from policies.gpulabels import (
    GKE_PARTITION,
    GKE_SHARING,
    MIG_LABEL_PREFIX,
    MIG_STRATEGY,
    PRODUCT,
    SHARING,
    SLICES_PREFIX,
)
from policies.nodeindex import NodeIndex, as_mask, expression_mask
from policies.topology import HOSTNAME
from policies.workloads import Json


@dataclass(frozen=True)
class Groups:
    """The node sets gpulabels' functions take as label lists (live nodes only: declared pools have no labels
    to select them by)."""

    whole: int  # whole-card nodes
    not_whole: int  # MIG or shared nodes offering nvidia.com/gpu
    exclusive: int  # unshared nodes offering nvidia.com/gpu
    shared: int  # time-sliced / MPS nodes offering nvidia.com/gpu


def expressions(index: NodeIndex, g: Groups) -> tuple[tuple[Json, ...], tuple[Json, ...], list[str]]:
    """(whole-card expressions, not-shared expressions, problems), as gpulabels computes them."""
    whole_exprs = [*gpulabels.BASE_EXPRESSIONS, *_mixed(index, g)]
    if g.not_whole & _non_empty(index, GKE_PARTITION):
        whole_exprs.append({"key": GKE_PARTITION, "operator": "DoesNotExist"})
    whole_exprs += _sharing(index, g.not_whole)
    whole, problems = _selection(index, whole_exprs, g.whole, g.not_whole, "MIG or shared")
    unshared_exprs = [gpulabels.BASE_EXPRESSIONS[0], *_sharing(index, g.shared)]
    unshared, more = _selection(index, unshared_exprs, g.exclusive, g.shared, "time-sliced or MPS")
    return whole, unshared, problems + more


_READ = frozenset({SHARING, PRODUCT, MIG_STRATEGY, GKE_PARTITION, GKE_SHARING, HOSTNAME})


def reads(key: str) -> bool:
    """Whether `expressions` reads this label key (HOSTNAME: the names in its problem lines)."""
    return key in _READ or key.startswith((MIG_LABEL_PREFIX, SLICES_PREFIX))


def same_inputs(old: NodeIndex, new: NodeIndex) -> bool:
    """Whether `expressions` would answer the same for `new` as for `old`: same node sets, and the postings of
    every label key it reads shared (copy-on-write leaves untouched ones the same object)."""
    if new.sets is not old.sets or len(new) != len(old):
        return False
    if new.labels is old.labels:
        return True
    keys = set(old.labels).union(new.labels)
    return all(old.labels.get(k) is new.labels.get(k) for k in keys if reads(k))


def _non_empty(index: NodeIndex, key: str) -> int:
    """Nodes with a non-empty value for key (`labels.get(key)` is truthy)."""
    return as_mask(index.has.get(key)) & ~index.label(key, "")


def _profiles(index: NodeIndex) -> dict[str, int]:
    """MIG profile -> nodes with a positive `nvidia.com/mig-<profile>.count` (gpulabels.mig_count_profiles)."""
    out: dict[str, int] = {}
    for key in index.labels:
        if key.startswith(MIG_LABEL_PREFIX) and key.endswith(".count"):
            mask = 0
            for value, posting in index.values(key):
                if value.isascii() and value.isdigit() and int(value) > 0:
                    mask |= as_mask(posting)
            if mask:
                out[key[len(MIG_LABEL_PREFIX) : -len(".count")]] = mask
    return out


def _mixed(index: NodeIndex, g: Groups) -> list[Json]:
    profiles = _profiles(index)
    mixed = 0
    for mask in profiles.values():
        mixed |= mask & g.not_whole
    if not mixed:
        return []
    labelled_mixed = index.label(MIG_STRATEGY, "mixed")
    if not mixed & ~labelled_mixed and not g.whole & labelled_mixed:
        return [{"key": MIG_STRATEGY, "operator": "NotIn", "values": ["mixed"]}]
    used = sorted(p for p, mask in profiles.items() if mask & mixed)
    return [{"key": f"{MIG_LABEL_PREFIX}{p}.count", "operator": "DoesNotExist"} for p in used]


def _sharing(index: NodeIndex, shared: int) -> list[Json]:
    extra: list[Json] = []
    if shared & _non_empty(index, GKE_SHARING):
        extra.append({"key": GKE_SHARING, "operator": "DoesNotExist"})
    unlabelled = shared & ~as_mask(index.has.get(SHARING))
    products = sorted(v for v, p in index.values(PRODUCT) if v.endswith("-SHARED") and as_mask(p) & unlabelled)
    if products:
        extra.append({"key": PRODUCT, "operator": "NotIn", "values": products})
    return extra


def _selection(
    index: NodeIndex, exprs: list[Json], admit: int, exclude: int, what: str
) -> tuple[tuple[Json, ...], list[str]]:
    kept = [e for e in exprs if e in gpulabels.BASE_EXPRESSIONS or not admit & ~expression_mask(index, e)]
    leaking = exclude
    for e in kept:
        leaking &= expression_mask(index, e)
    if not leaking:
        return tuple(kept), []
    names = ", ".join(sorted(n.labels.get(HOSTNAME, "?") for n in index.node_list(leaking))[:3])
    return tuple(kept), [f"{leaking.bit_count()} {what} GPU node(s) ({names}) carry no label that tells them apart"]
