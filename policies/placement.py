"""Gang-safe, capacity-aware placement: which domain of a topology label can hold a whole multi-pod job.

Pure: the inventory's nodes, what the pod view says is in use (plain immutable data), the server's
reservations and the gang (GPUs per pod, one entry per pod) in; a `Decision` out. Keyed by the topology
label key, not "the rack": a caller with several topology levels asks once per level, narrowest first.

Capacity is counted per node in pod-sized pieces: a node with 12 free GPUs holds one 8-GPU pod, not 1.5,
and 4 free GPUs on each of 4 nodes hold no 8-GPU pod at all. A gang fits a domain when its pods, placed
largest first on the node with the least room that still takes them (best fit), all find a node.

- static rule (no pod view needed): a domain whose allocatable cannot hold the gang is never eligible;
- best fit: of the domains that hold the gang now, the one with the least free room (in pieces of the
  gang's largest pod, then free GPUs, then name: deterministic);
- nothing fits now: the domain with the most free room (the `prefer` fallback), and the domain that would
  fit soonest with how many GPUs must free up there (the `deny` message).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

# Decision.source values
BEST_FIT = "best-fit"  # chosen now from the capacity view
PEERS = "peers"  # the job's pods already bound there
RESERVED = "reserved"  # chosen earlier for this job (a reservation not yet fully bound)
STATIC = "static"  # no capacity view: only the eligible domains are known
NONE_FITS_NOW = "none-fits-now"  # eligible domains exist, none holds the gang now
NEVER_FITS = "never-fits"  # no domain's allocatable holds the gang
# Per capacity snapshot: distinct (inventory, candidates, key) groupings kept, and (grouping, gang) answers.
MEMO_SIZE = 256
# Larger gangs are not placed by this module (the fit search is linear in pods): docs/policy.md.
MAX_GANG_PODS = 1024


@dataclass(frozen=True)
class Capacity:
    """The pod view as plain data: whole GPUs held per node by pods not yet terminated, and per job the
    nodes its pods are bound to. `synced` is False until the view has listed every pod once."""

    used: Mapping[str, int]
    jobs: Mapping[str, Mapping[str, int]]  # job id -> node name -> pods of the job bound there
    synced: bool = True
    version: int = 0
    # Answers derived from this snapshot (it never changes: the pod view publishes a new one per event).
    _memo: dict[Any, Any] = field(default_factory=dict, init=False, repr=False, compare=False)

    def bound_pods(self, job: str) -> int:
        return sum(self.jobs.get(job, {}).values())

    def memo(self, key: Any, compute: Callable[[], Any]) -> Any:
        return memoize(self._memo, key, compute)


def memoize(store: dict[Any, Any], key: Any, compute: Callable[[], Any]) -> Any:
    """store[key], computed on first use. Bounded by clearing: entries are cheap to recompute, and the
    stores live on immutable snapshots that are replaced as the cluster changes. Values should keep alive
    any object whose id() is part of the key, so that id is never reused while the entry exists."""
    hit = store.get(key)
    if hit is None:
        if len(store) >= MEMO_SIZE:
            store.clear()
        hit = store[key] = compute()
    return hit


@dataclass(frozen=True)
class Reservation:
    """GPUs promised to a job the webhook pinned, until its pods are seen bound (or `expires`, a clock value
    of the caller's: the engine never reads a clock). `sizes`: GPUs of each pod of the gang."""

    job: str
    key: str
    domain: str
    sizes: tuple[int, ...]
    expires: float = 0.0


@dataclass(frozen=True)
class Room:
    domain: str
    holds: bool  # the domain's allocatable holds the gang (static rule)
    fits: bool  # its free GPUs hold the gang now (after others' reservations)
    pieces: int  # free pieces the size of the gang's largest pod
    free_gpus: int
    shortfall: int  # GPUs that must free up before the gang fits (0 when it fits)


@dataclass(frozen=True)
class Decision:
    key: str
    source: str
    domain: str | None  # the one domain to pin (best fit, peers, reserved), else None
    eligible: tuple[str, ...]  # domains whose allocatable holds the gang, sorted
    roomiest: str | None = None  # the domain with most free room, eligible or not (prefer fallback)
    closest: str | None = None  # the eligible domain needing the fewest GPUs to free up
    shortfall: int = 0  # ... that many

    @property
    def pinned(self) -> bool:
        return self.domain is not None


@dataclass(frozen=True)
class DomainNodes:
    """Per domain, the whole GPUs of each candidate node: allocatable and free now (sorted, ascending)."""

    allocatable: Mapping[str, tuple[int, ...]]
    free: Mapping[str, tuple[int, ...]]
    node_domain: Mapping[str, str]


def job_id(namespace: str, key: str, value: str) -> str:
    """One job across reviews: its namespace and identity label (pods and templates agree on it)."""
    return f"{namespace}/{key}={value}"


def group(nodes: Iterable[Any], key: str, capacity: Capacity | None) -> DomainNodes:
    """Candidate nodes (GpuNode-like: name, labels, whole_gpus) by their value of `key`, with free GPUs."""
    alloc: dict[str, list[int]] = {}
    free: dict[str, list[int]] = {}
    where: dict[str, str] = {}
    used = capacity.used if capacity is not None else {}
    for n in nodes:
        domain = n.labels.get(key)
        if not domain or n.whole_gpus <= 0:
            continue
        where[n.name] = domain
        alloc.setdefault(domain, []).append(n.whole_gpus)
        free.setdefault(domain, []).append(max(n.whole_gpus - used.get(n.name, 0), 0))
    return DomainNodes(
        {d: tuple(sorted(v)) for d, v in alloc.items()},
        {d: tuple(sorted(v)) for d, v in free.items()},
        where,
    )


def place(free: Sequence[int], sizes: Sequence[int], *, spread: bool = False) -> tuple[int, ...] | None:
    """Best fit decreasing: each pod, largest first, on the node with the least free GPUs that still takes
    it (`spread`: the most, as kube-scheduler's least-allocated scoring tends to). The nodes' free GPUs
    afterwards (sorted), or None when some pod finds no node."""
    left = sorted(free, reverse=spread)
    for size in sorted(sizes, reverse=True):
        for i, f in enumerate(left):
            if f >= size:
                left[i] = f - size
                break
        else:
            return None
        if spread:
            left.sort(reverse=True)
    return tuple(sorted(left))


def pieces(free: Sequence[int], size: int) -> int:
    return sum(f // size for f in free) if size > 0 else 0


def shortfall(free: Sequence[int], alloc: Sequence[int], sizes: Sequence[int]) -> int:
    """GPUs that must free up in the domain before the gang fits: the fewest, freeing whole nodes' worth
    on the nodes nearest to taking one more pod first (an estimate; exact only for equal pods)."""
    if place(free, sizes) is not None:
        return 0
    if place(alloc, sizes) is None:
        return sum(sizes)  # never: the caller reports the domain as not eligible
    state = sorted(zip(free, alloc, strict=True))
    size = max(sizes)
    needed = 0
    while place([f for f, _ in state], sizes) is None:
        # One more piece of the largest pod, where it costs fewest GPUs to free (nodes that can ever give
        # one first); the allocatable placement succeeds, so this ends with every node at its allocatable.
        costs = [(size - f % size, i) for i, (f, a) in enumerate(state) if f < a]
        cost, i = min(costs, key=lambda c: (c[0] > state[c[1]][1] - state[c[1]][0], c[0], c[1]))
        f, a = state[i]
        step = min(cost, a - f)
        state[i] = (f + step, a)
        needed += step
    return needed


def rooms(nodes: DomainNodes, sizes: Sequence[int], reservations: Sequence[Reservation]) -> tuple[Room, ...]:
    """Each domain's room for the gang, after the others' reservations (placed like gangs, best fit)."""
    out = []
    size = max(sizes, default=0)
    for domain in sorted(nodes.allocatable):
        alloc = nodes.allocatable[domain]
        free: tuple[int, ...] | None = nodes.free[domain]
        for r in reservations:
            # Others' pods yet to bind are assumed spread over the nodes (the default scheduler spreads; our
            # pins do not pack): counting them packed would promise pieces their spread pods will split.
            if r.domain == domain and free is not None:
                free = place(free, r.sizes, spread=True) or tuple(0 for _ in free)  # no longer fits: all taken
        assert free is not None
        holds = place(alloc, sizes) is not None
        fits = holds and place(free, sizes) is not None
        missing = 0 if fits or not holds else shortfall(free, alloc, sizes)
        out.append(Room(domain, holds, fits, pieces(free, size), sum(free), missing))
    return tuple(out)


def decide(
    nodes: DomainNodes,
    key: str,
    sizes: Sequence[int],
    capacity: Capacity | None,
    reservations: Sequence[Reservation] = (),
    job: str | None = None,
) -> Decision | None:
    """Where the gang goes on topology label `key`: see the module docstring. `reservations` are every
    job's; the job's own (by `job`) and its bound peers come first, so its pods all get one domain.
    None when the gang's pods are unknown (`sizes` empty) and neither says where its peers are."""
    own = [r for r in reservations if r.job == job and r.key == key and r.domain in nodes.allocatable]
    others = [r for r in reservations if r.job != job and r.key == key]
    if capacity is not None and job is not None:
        peers = sorted({nodes.node_domain[n] for n in capacity.jobs.get(job, {}) if n in nodes.node_domain})
        rest = tuple(sizes[capacity.bound_pods(job) :])
        # Join the peers only where the rest of the gang still fits: a job that had to spread (no domain
        # held it) must not have its later pods pinned next to the first ones and stranded.
        if len(peers) == 1 and (not rest or place(nodes.free.get(peers[0], ()), rest) is not None):
            return Decision(key, PEERS, peers[0], (peers[0],))
    if own:
        return Decision(key, RESERVED, own[-1].domain, (own[-1].domain,))
    if not sizes:
        return None
    all_rooms = rooms(nodes, sizes, others if capacity is not None else ())
    eligible = tuple(r.domain for r in all_rooms if r.holds)
    if not eligible:
        return Decision(key, NEVER_FITS, None, ())
    if capacity is None or not capacity.synced:
        return Decision(key, STATIC, None, eligible)
    fitting = [r for r in all_rooms if r.fits]
    if fitting:
        best = min(fitting, key=lambda r: (r.pieces, r.free_gpus, r.domain))
        return Decision(key, BEST_FIT, best.domain, eligible)
    roomiest = max(all_rooms, key=lambda r: (r.pieces, r.free_gpus, _desc(r.domain)))
    closest = min((r for r in all_rooms if r.holds), key=lambda r: (r.shortfall, r.domain))
    return Decision(key, NONE_FITS_NOW, None, eligible, roomiest.domain, closest.domain, closest.shortfall)


def _desc(name: str) -> tuple[int, ...]:
    return tuple(-ord(c) for c in name)  # max() over names: the first in sorted order wins a tie


def gang_sizes(gpus: int, per_pod: int) -> tuple[int, ...]:
    """GPUs of each pod of a job of `gpus` GPUs in pods of `per_pod` (the last taking any remainder);
    () when the sizes are unknown or the gang would be larger than MAX_GANG_PODS."""
    if gpus <= 0 or per_pod <= 0 or gpus // per_pod > MAX_GANG_PODS:
        return ()
    full, rest = divmod(gpus, per_pod)
    return (per_pod,) * full + ((rest,) if rest else ())
