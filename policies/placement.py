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

import bisect
import functools
import itertools
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
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
# Generations of a Grouping whose changed domains are remembered (older ones rebuild a gang's RoomIndex).
STEPS_KEPT = 4096
# Gang shapes whose RoomIndex a Grouping keeps (each ~1 MB at 3,000 domains; a cluster runs a few shapes).
INDEXES_KEPT = 16


@dataclass(frozen=True)
class Capacity:
    """The pod view as plain data: whole GPUs held per node by pods not yet terminated, and per job the
    nodes its pods are bound to. `synced` is False until the view has listed every pod once."""

    used: Mapping[str, int]
    jobs: Mapping[str, Mapping[str, int]]  # job id -> node name -> pods of the job bound there
    synced: bool = True
    version: int = 0
    # Which pod view this is a snapshot of, and the nodes whose GPUs changed there after a version (None:
    # not known any more): the per-domain counts are then updated for those domains only (`Grouping`).
    source: int = 0
    changed_since: Callable[[int], frozenset[str] | None] | None = field(default=None, compare=False)
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
    shortfall: int = 0  # GPUs to free up before it fits (an eligible domain's; see shortfall())


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
    """Per domain, the whole GPUs of each candidate node: allocatable and free now (sorted, ascending).
    `owner` (the Grouping that made it, if any) keeps each gang's rooms across its generations."""

    allocatable: Mapping[str, tuple[int, ...]]
    free: Mapping[str, tuple[int, ...]]
    node_domain: Mapping[str, str]
    generation: int = field(default=0, compare=False)
    owner: Grouping | None = field(default=None, compare=False, repr=False)
    counts: Mapping[int, int] | None = field(default=None, compare=False, repr=False)  # free GPUs -> nodes
    node_gpus: Mapping[str, int] = field(default_factory=dict, compare=False, repr=False)  # node -> whole GPUs

    def free_counts(self) -> Counter[int]:
        """Free GPUs -> how many candidate nodes (of every domain) have that many: a copy to edit."""
        if self.counts is not None:
            return Counter(self.counts)
        return Counter(f for free in self.free.values() for f in free)

    @property
    def domains(self) -> list[str]:
        return sorted(self.allocatable)

    def room_index(self, sizes: tuple[int, ...]) -> RoomIndex:
        if self.owner is None:
            return RoomIndex.build(self, sizes)
        return self.owner.room_index(self, sizes)


@dataclass(frozen=True)
class RoomIndex:
    """Every domain's room for one gang shape, without reservations, and the orders decide() reads: best fit
    first, most room first, fewest GPUs missing first. Brought from one generation of a Grouping to the next
    by recomputing the changed domains only (O(changed · log domains)), so a decision after a pod event
    does not walk every domain."""

    generation: int
    sizes: tuple[int, ...]
    rooms: Mapping[str, Room]
    eligible: tuple[str, ...]  # domains whose allocatable holds the gang, sorted (fixed for a Grouping)
    fitting: list[tuple[Any, ...]]  # (pieces, free GPUs, domain) of the domains it fits now, ascending
    roomy: list[tuple[Any, ...]]  # (-pieces, -free GPUs, domain) of every domain, ascending
    short: list[tuple[Any, ...]]  # (shortfall, domain) of the eligible domains, ascending

    @classmethod
    def build(cls, nodes: DomainNodes, sizes: tuple[int, ...]) -> RoomIndex:
        rooms = {d: _room_of(nodes, d, nodes.free[d], sizes) for d in nodes.allocatable}
        out = cls(nodes.generation, sizes, rooms, tuple(sorted(d for d, r in rooms.items() if r.holds)), [], [], [])
        for r in rooms.values():
            out._insert(r)
        out.fitting.sort()
        out.roomy.sort()
        out.short.sort()
        return out

    def updated(self, nodes: DomainNodes, changed: Iterable[str]) -> RoomIndex:
        rooms = dict(self.rooms)
        out = RoomIndex(
            nodes.generation, self.sizes, rooms, self.eligible, list(self.fitting), list(self.roomy), list(self.short)
        )
        for d in changed:
            old = rooms.get(d)
            if old is not None:
                out._remove(old)
                new = rooms[d] = _room_of(nodes, d, nodes.free[d], self.sizes)
                out._insert(new, sort=True)
        return out

    def _keys(self, r: Room) -> tuple[tuple[Any, ...] | None, ...]:
        return (
            (r.pieces, r.free_gpus, r.domain) if r.fits else None,
            (-r.pieces, -r.free_gpus, r.domain),
            (r.shortfall, r.domain) if r.holds else None,
        )

    def _insert(self, r: Room, sort: bool = False) -> None:
        for keys, key in zip((self.fitting, self.roomy, self.short), self._keys(r), strict=True):
            if key is not None and sort:
                bisect.insort(keys, key)
            elif key is not None:
                keys.append(key)  # build(): sorted once at the end

    def _remove(self, r: Room) -> None:
        for keys, key in zip((self.fitting, self.roomy, self.short), self._keys(r), strict=True):
            if key is not None:
                del keys[bisect.bisect_left(keys, key)]


def _room_of(nodes: DomainNodes, domain: str, free: tuple[int, ...], sizes: tuple[int, ...]) -> Room:
    return Room(domain, *_room(nodes.allocatable[domain], free, sizes))


def job_id(namespace: str, key: str, value: str) -> str:
    """One job across reviews: its namespace and identity label (pods and templates agree on it)."""
    return f"{namespace}/{key}={value}"


def group(nodes: Iterable[Any], key: str, capacity: Capacity | None) -> DomainNodes:
    """Candidate nodes (GpuNode-like: name, labels, whole_gpus) by their value of `key`, with free GPUs."""
    return Grouping(nodes, key).at(capacity)


class Grouping:
    """One set of candidate nodes by domain of `key`, kept across pod-view snapshots: built once (O(nodes)),
    then each newer snapshot of the same view recomputes only the domains of the nodes whose GPUs changed
    since the last one (`Capacity.changed_since`), so a review after a pod event does not walk every node.
    Shared by concurrent reviews: `_last` is replaced whole, a race only recomputes."""

    def __init__(self, nodes: Iterable[Any], key: str) -> None:
        members: dict[str, list[tuple[str, int]]] = {}
        for n in nodes:
            domain = n.labels.get(key)
            if domain and n.whole_gpus > 0:
                members.setdefault(domain, []).append((n.name, n.whole_gpus))
        self.members = {d: tuple(m) for d, m in members.items()}
        where = {name: d for d, m in self.members.items() for name, _ in m}
        alloc = {d: tuple(sorted(g for _, g in m)) for d, m in self.members.items()}
        gpus = {name: g for m in self.members.values() for name, g in m}
        self.static = DomainNodes(alloc, alloc, where, 0, self, Counter(g for a in alloc.values() for g in a), gpus)
        self._last: tuple[int, int, DomainNodes] | None = None
        # Generations of DomainNodes made here: generation -> (the one it was derived from, the domains that
        # changed; None: all). Bounded: a generation no longer known rebuilds what needs it.
        self._steps: dict[int, tuple[int, frozenset[str] | None]] = {}
        self._generation = itertools.count(1)
        self._indexes: dict[tuple[int, ...], RoomIndex] = {}  # gang shape -> its latest RoomIndex

    def room_index(self, nodes: DomainNodes, sizes: tuple[int, ...]) -> RoomIndex:
        """The rooms of gang `sizes` at `nodes` (one of this grouping's generations), from the last ones."""
        last = self._indexes.get(sizes)
        if last is not None and last.generation == nodes.generation:
            return last
        changed = self._changed(last.generation, nodes.generation) if last is not None else None
        index = RoomIndex.build(nodes, sizes) if changed is None else last.updated(nodes, changed)  # type: ignore[union-attr]
        if len(self._indexes) >= INDEXES_KEPT:
            self._indexes.clear()
        self._indexes[sizes] = index
        return index

    def _changed(self, old: int, new: int) -> set[str] | None:
        """Domains changed from generation `old` to `new`; None when not known (then rebuild)."""
        out: set[str] = set()
        while new != old:
            step = self._steps.get(new)
            if step is None or step[1] is None or step[0] >= new:
                return None
            out |= step[1]
            new = step[0]
            if new < old:
                return None
        return out

    def at(self, capacity: Capacity | None) -> DomainNodes:
        if capacity is None:
            return self.static
        last = self._last
        changed = None
        if last is not None and last[0] == capacity.source:
            if last[1] == capacity.version:
                return last[2]
            if capacity.changed_since is not None and capacity.version > last[1]:
                changed = capacity.changed_since(last[1])
        used = capacity.used
        generation = next(self._generation)
        if last is None or changed is None:
            free = {d: _free(m, used) for d, m in self.members.items()}
            counts = Counter(f for fs in free.values() for f in fs)
            self._steps[generation] = (0, None)
        else:
            free, counts = dict(last[2].free), last[2].free_counts()
            where = self.static.node_domain
            domains = frozenset(where[n] for n in changed if n in where)
            for d in domains:
                counts.subtract(free[d])
                free[d] = _free(self.members[d], used)
                counts.update(free[d])
            self._steps[generation] = (last[2].generation, domains)
        self._steps.pop(generation - STEPS_KEPT, None)
        static = self.static
        out = DomainNodes(static.allocatable, free, static.node_domain, generation, self, +counts, static.node_gpus)
        self._last = (capacity.source, capacity.version, out)
        return out


def _free(members: Sequence[tuple[str, int]], used: Mapping[str, int]) -> tuple[int, ...]:
    return tuple(sorted(max(g - used.get(name, 0), 0) for name, g in members))


def place(free: Sequence[int], sizes: Sequence[int]) -> tuple[int, ...] | None:
    """Best fit decreasing: each pod, largest first, on the node with the least free GPUs that still takes
    it. The nodes' free GPUs afterwards (sorted), or None when some pod finds no node."""
    left = sorted(free)
    for size in sorted(sizes, reverse=True):
        i = bisect.bisect_left(left, size)
        if i == len(left):
            return None
        bisect.insort(left, left.pop(i) - size)  # kept sorted: the next pod's best fit is a bisection
    return tuple(left)


def fits_counts(counts: Counter[int], sizes: Sequence[int]) -> bool:
    """place() on nodes given as counts per free GPUs (free GPUs -> nodes; edited): the same best fit, in
    O(pods · distinct values) however many nodes there are."""
    values = sorted(v for v, c in counts.items() if c > 0)
    for size in sorted(sizes, reverse=True):
        i = bisect.bisect_left(values, size)
        if i == len(values):
            return False
        f = values[i]
        counts[f] -= 1
        if counts[f] <= 0:
            values.pop(i)
        if counts[f - size] <= 0:
            counts[f - size] = 0
            bisect.insort(values, f - size)
        counts[f - size] += 1
    return True


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


@functools.lru_cache(maxsize=1 << 14)
def _shortfall(free: tuple[int, ...], alloc: tuple[int, ...], sizes: tuple[int, ...]) -> int:
    return shortfall(free, alloc, sizes)  # by value: domains alike (and unchanged) cost a lookup


def rooms(nodes: DomainNodes, sizes: Sequence[int], reservations: Sequence[Reservation]) -> tuple[Room, ...]:
    """Each domain's room for the gang, after the others' reservations (placed like gangs, best fit)."""
    gang = tuple(sizes)
    held = {r.domain for r in reservations}
    out = []
    for domain in nodes.domains:
        free = nodes.free[domain]
        if domain in held:
            free = after_reservations(free, domain, reservations)
        out.append(Room(domain, *_room(nodes.allocatable[domain], free, gang)))
    return tuple(out)


@functools.lru_cache(maxsize=1 << 16)
def _room(alloc: tuple[int, ...], free: tuple[int, ...], sizes: tuple[int, ...]) -> tuple[bool, bool, int, int, int]:
    """(holds, fits, pieces, free GPUs, shortfall) of one domain: by value, so domains alike cost a lookup."""
    holds = place(alloc, sizes) is not None
    fits = holds and place(free, sizes) is not None
    short = _shortfall(free, alloc, sizes) if holds and not fits else 0
    return holds, fits, pieces(free, max(sizes, default=0)), sum(free), short


def after_reservations(free: Sequence[int], domain: str, reservations: Sequence[Reservation]) -> tuple[int, ...]:
    """A domain's free GPUs per node once others' reserved pods are placed there like any gang: per node in
    pod-sized pieces, best fit (training-node-pack asks the scheduler to pack a pinned gang's pods, and
    reserved-keep-off keeps other pods off what is left to it). Reservations that no longer fit take all."""
    left = _placed(free, domain, reservations)
    return left if left is not None else tuple(0 for _ in free)


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
    gang = tuple(sizes)
    index = nodes.room_index(gang)  # every domain's room without reservations, kept across pod events
    if not index.eligible:
        return Decision(key, NEVER_FITS, None, ())
    if capacity is None or not capacity.synced:
        return Decision(key, STATIC, None, index.eligible)
    # The few domains others' reservations are in: their rooms after those, in place of the index's.
    held = {
        d: _room_of(nodes, d, after_reservations(nodes.free[d], d, others), gang)
        for d in {r.domain for r in others}
        if d in nodes.allocatable
    }
    best = _first(index.fitting, held, [(r.pieces, r.free_gpus, r.domain) for r in held.values() if r.fits])
    if best is not None:
        return Decision(key, BEST_FIT, best[2], index.eligible)
    roomiest = _first(index.roomy, held, [(-r.pieces, -r.free_gpus, r.domain) for r in held.values()])
    missing, closest = _first(index.short, held, [(r.shortfall, r.domain) for r in held.values() if r.holds])
    return Decision(key, NONE_FITS_NOW, None, index.eligible, roomiest[2] if roomiest else None, closest, missing)


def _first(keys: Sequence[tuple[Any, ...]], held: Mapping[str, Room], extra: list[tuple[Any, ...]]) -> Any:
    """The least of `keys` (sorted, the domain last) whose domain is not in `held`, and of `extra`; None when
    both are empty."""
    found = next((k for k in keys if k[-1] not in held), None)
    return min([*extra, found] if found is not None else extra, default=None)


def gang_sizes(gpus: int, per_pod: int) -> tuple[int, ...]:
    """GPUs of each pod of a job of `gpus` GPUs in pods of `per_pod` (the last taking any remainder);
    () when the sizes are unknown or the gang would be larger than MAX_GANG_PODS."""
    if gpus <= 0 or per_pod <= 0:
        return ()
    full, rest = divmod(gpus, per_pod)
    if full + (1 if rest else 0) > MAX_GANG_PODS:  # the remainder's pod counts too
        return ()
    return (per_pod,) * full + ((rest,) if rest else ())


@dataclass(frozen=True)
class KeepOff:
    """Domains of topology label `key` a pod should stay off because, landing there, it could take GPUs
    reserved for another job; `required` when the pod (with the rest of its gang) fits elsewhere now."""

    key: str
    avoid: tuple[str, ...]
    required: bool


def keep_off(
    nodes: DomainNodes, key: str, sizes: Sequence[int], reservations: Sequence[Reservation], job: str | None
) -> KeepOff | None:
    """Where a pod of `sizes` (its own first, then its gang's unbound rest) must not go so that others'
    reservations still fit: a reserved domain is avoided when some node the pod could land on there (any
    node with room: the scheduler does not know the reservation) leaves the reserved gangs no placement.
    None when nothing is at risk, or when the pod could only go where GPUs are reserved (nothing to prefer)."""
    held = [r for r in reservations if r.key == key and r.job != job and r.domain in nodes.free]
    if not held or not sizes:
        return None
    reserved = {r.domain for r in held}
    avoid = tuple(sorted(d for d in reserved if _lands_on_reserved(nodes.free[d], sizes[0], d, held)))
    if not avoid:
        return None
    # The other domains' nodes, reserved gangs placed: counted per free GPUs (O(reserved domains), not nodes).
    rest = nodes.free_counts()
    for d in reserved:
        rest.subtract(nodes.free[d])
        if d not in avoid:
            rest.update(after_reservations(nodes.free[d], d, held))
    if not any(c > 0 and f >= sizes[0] for f, c in rest.items()):
        return None
    return KeepOff(key, avoid, fits_counts(rest, sizes))


def only_reserved(
    nodes: DomainNodes, key: str, size: int, reservations: Sequence[Reservation], job: str | None
) -> tuple[str, ...]:
    """The reserved domains of topology label `key` when every node with room for a pod of `size` GPUs is in
    one of them and, with the pod on it, that domain's reserved gangs (other jobs') no longer fit: the pod
    can run now only on GPUs promised to a gang. () when some node takes it without harm, or none takes it."""
    held = [r for r in reservations if r.key == key and r.job != job and r.domain in nodes.free]
    if not held or size <= 0:
        return ()
    reserved = {r.domain for r in held}
    elsewhere = nodes.free_counts()  # nodes of the domains nobody reserved: counted, not walked
    for d in reserved:
        elsewhere.subtract(nodes.free[d])
    if any(c > 0 and f >= size for f, c in elsewhere.items()):
        return ()
    hurt = []
    for domain in sorted(reserved):
        free = nodes.free[domain]
        if not free or free[-1] < size:  # sorted ascending: no node of the domain takes the pod
            continue
        if _lands_harmlessly(free, size, domain, held):
            return ()
        hurt.append(domain)
    return tuple(hurt)


def _landings(free: Sequence[int], size: int, domain: str, held: Sequence[Reservation]) -> Iterator[bool]:
    """For each distinct node of the domain that takes the pod: whether the domain's reservations still fit
    with the pod there."""
    for f in sorted(set(free)):
        if f >= size:
            left = list(free)
            left[left.index(f)] = f - size
            yield _placed(left, domain, held) is not None


def _lands_harmlessly(free: Sequence[int], size: int, domain: str, held: Sequence[Reservation]) -> bool:
    return any(_landings(free, size, domain, held))


def _lands_on_reserved(free: Sequence[int], size: int, domain: str, held: Sequence[Reservation]) -> bool:
    return not all(_landings(free, size, domain, held))


@dataclass(frozen=True)
class BindHarm:
    """A bind that takes GPUs other jobs' reserved gangs need: the node's domain of `key`, the jobs whose
    gangs would no longer fit there, and the node's free GPUs before the pod."""

    key: str
    domain: str
    jobs: tuple[str, ...]
    free: int


def bind_harm(
    nodes: DomainNodes,
    key: str,
    node: str,
    size: int,
    used: Mapping[str, int],
    reservations: Sequence[Reservation],
    job: str | None,
) -> BindHarm | None:
    """Whether binding a pod of `size` whole GPUs (of job `job`) to `node` breaks a reservation of another
    job in the node's domain of `key`: some reserved gang that fits the domain now (the reserved gangs placed
    best fit, in the order they were made, a gang that does not fit skipped) would not with the pod on the
    node. `used`: whole GPUs held per node (the pod view's, whose snapshot `nodes` is at). None when the bind
    harms none — also when the view says the node has no room for the pod (it is behind the cluster: the
    kubelet judges) or the reserved gangs did not fit anyway (refusing would keep nothing for them)."""
    domain = nodes.node_domain.get(node)
    held = [r for r in reservations if r.key == key and r.domain == domain and r.job != job]
    if domain is None or not held or size <= 0:
        return None
    free = nodes.free[domain]
    mine = max(nodes.node_gpus.get(node, 0) - used.get(node, 0), 0)
    if mine < size or mine not in free:
        return None
    before = _fitting(free, held)
    left = list(free)
    left[left.index(mine)] = mine - size
    after = _fitting(left, held)
    lost = tuple(r.job for r in before if r not in after)
    return BindHarm(key, domain, lost, mine) if lost else None


def _fitting(free: Sequence[int], held: Sequence[Reservation]) -> list[Reservation]:
    """The reservations that fit, placed best fit one after the other (one that does not fit takes nothing)."""
    left = tuple(sorted(free))
    out = []
    for r in held:
        placed = place(left, r.sizes)
        if placed is not None:
            left = placed
            out.append(r)
    return out


def _placed(free: Sequence[int], domain: str, held: Sequence[Reservation]) -> tuple[int, ...] | None:
    """The domain's free GPUs per node after its reserved gangs, placed best fit; None if they do not fit."""
    left: tuple[int, ...] | None = tuple(sorted(free))
    for r in held:
        if r.domain == domain and left is not None:
            left = place(left, r.sizes)
    return left
