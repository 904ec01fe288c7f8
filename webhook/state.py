"""What the server decides with, kept current off the request path: policy, GPU inventory, namespace labels,
and a read-only cache of HPA targets.

Readers take one consistent snapshot (`State.snapshot()`), an immutable tuple swapped atomically by the
watcher threads, so a request never blocks on the Kubernetes API or on a reload.
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import logging
import operator
import os
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

from cluster.coalesce import Coalescer
from cluster.dra import PATHS as DRA_PATHS
from cluster.dra import SliceIndex, slim_slice, slim_spec
from cluster.labelsets import NodeLabels
from cluster.namespaced import IndexSnapshot, NamespacedIndex
from cluster.nodes import NODE_DECODERS, NodeRecord, NodeTransform, as_object, record, same_content
from cluster.pods import PodEntry, PodSnapshot, PodView
from cluster.pods import entry as pod_entry_of
from policies import dra
from policies import exceptions as exceptions_mod
from policies import inventory as inventory_mod
from policies.document import MAX_POLICY_BYTES, Policy, PolicyError, default_policy, parse_policy_text
from policies.inventory import Inventory
from policies.placement import Capacity
from policies.resources import GPU
from policies.subject import pod_facts
from webhook.reservations import Reservations

log = logging.getLogger("gpu-admission.state")

POLICY_KEY = "policy.yaml"
# Seconds an edited policy file must stay unchanged before it loads (a half-written file is not served).
POLICY_SETTLE = 0.3
# Related objects resolved from a cache: HPA / ScaledObject targets (CRD targets fall back to classification
# by kind), and the Kubeflow Trainer runtimes whose JobSet template holds a TrainJob's pods.
TARGET_PATHS = {"Deployment": "/apis/apps/v1/deployments", "StatefulSet": "/apis/apps/v1/statefulsets"}
RUNTIME_PATHS = {
    "TrainingRuntime": "/apis/trainer.kubeflow.org/v1alpha1/trainingruntimes",
    "ClusterTrainingRuntime": "/apis/trainer.kubeflow.org/v1alpha1/clustertrainingruntimes",
}
# Where the Trainer is not installed its runtimes answer 404: retried this rarely (seconds), one warning each.
OPTIONAL_BACKOFF = 300.0
# Node events are applied to the inventory in batches at most this often (seconds): a storm of updates costs
# one batch of distinct nodes per interval, and reviews see a node change at most this much later.
NODE_BATCH_INTERVAL = 0.05
# Nodes per list page: a page of real Node objects is ~20 KB each, and every page is decoded whole before it is
# cut down; 100 keeps that transient peak near 10 MB instead of the 50 MB of the API's usual 500.
NODE_PAGE = 100
# Seconds the pod watch waits at most for the first Node list to be built before it starts anyway (see
# State.watch_pods; it starts at once when that list fails).
POD_WATCH_WAIT = 600.0


@dataclass(frozen=True)
class Snapshot:
    policy: Policy
    inventory: Inventory
    namespaces: dict[str, dict[str, str]]
    resolve: Callable[[str, str, str], dict[str, Any] | None] | None


@dataclass
class Status:
    policy_source: str = "built-in"
    policy_error: str | None = None
    policy_loaded_at: float = 0.0
    inventory_source: str = "none"
    inventory_synced: bool = False
    namespaces_synced: bool = True
    reloads: int = 0
    reload_failures: int = 0
    extra: dict[str, Any] = field(default_factory=dict)


class State:
    def __init__(self, policy: Policy | None = None) -> None:
        pol = policy or default_policy()
        self._snap = Snapshot(pol, inventory_mod.build((), pol), {}, None)
        self._nodes: list[NodeRecord] = []  # from a nodes file
        self._node_reflector: Any = None  # when watching: the Nodes (cut down by node_transform, kept as records)
        self._nodes_built = threading.Event()  # the first Node list is in the inventory (watch_nodes)
        self.node_transform = NodeTransform()
        self.node_batches: Coalescer | None = None
        self.node_events_unchanged = 0  # Node events with nothing the inventory reads changed: not queued
        self._lock = threading.Lock()
        self.status = Status(policy_loaded_at=time.time())
        self._stop = threading.Event()
        self._reflectors: list[Any] = []
        self._targets: dict[str, Any] = {}
        self.on_policy_change: list[Callable[[Policy], None]] = []
        # The pod view (None until watch_pods / load_pods): free GPUs for placement.
        self.pods: PodView | None = None
        self.pods_source = "none"
        self.pods_waiting = False  # the pod watch waits for the first Node list to be built (watch_pods)
        self._capacity: Capacity | None = None
        self.reservations = Reservations()
        # GPUPolicyExceptions by namespace (watch_exceptions); expired ones are logged once each.
        self.exceptions = NamespacedIndex(exceptions_mod.parse)
        self.exceptions_source = "none"
        self._expired_reported: set[str] = set()
        self.expired_reported = 0
        # DRA (resource.k8s.io/v1): devices per node from ResourceSlices, and the DeviceClasses (None: the
        # cluster's are not known, the NVIDIA driver's names are assumed). watch_dra keeps them current.
        self._devices: dict[str, dra.NodeDevices] = {}
        self._classes: dra.Classes | None = None
        self._slices = SliceIndex()
        self.dra_status: dict[str, Any] = {"served": None}
        self.ledger: Any = None  # a webhook.ledger.Tracker set before watch_pods: fed by the same pod watch
        # One pod read from the API server as a pod-view entry (pod_fetcher): the bind check's last resort for
        # a pod its watch has not delivered yet. None without a cluster.
        self.fetch_pod: Callable[[str, str], PodEntry | None] | None = None

    def snapshot(self) -> Snapshot:
        return self._snap

    # -- updates (watcher threads) --------------------------------------------------------------------

    def set_policy(self, policy: Policy, source: str) -> None:
        with self._lock:
            changed = policy.hash != self._snap.policy.hash
            inv = self._build(self._node_objects(), policy)  # pools and rack label depend on the policy
            self._snap = Snapshot(policy, inv, self._snap.namespaces, self._snap.resolve)
            self.status.policy_source = source
            self.status.policy_error = None
            self.status.policy_loaded_at = time.time()
            if changed:
                self.status.reloads += 1
        if changed:
            log.info("policy loaded", extra={"policy_hash": policy.hash, "source": source})
            for cb in self.on_policy_change:
                cb(policy)

    def policy_failed(self, error: str, source: str) -> None:
        with self._lock:
            self.status.policy_error = error
            self.status.reload_failures += 1
        log.error("policy rejected, keeping the last good one", extra={"error": error, "source": source})

    def set_nodes(self, nodes: list[dict[str, Any]], source: str, synced: bool = True) -> None:
        """A whole new set of Node objects (a nodes file), cut down like the watch's; ResourceSlices and
        DeviceClasses among them are the cluster's DRA devices and classes, as `check --nodes` reads them."""
        kinds = [o.get("kind") if isinstance(o, dict) else None for o in nodes]  # garbage: the transform counts it
        slices = [o for o, k in zip(nodes, kinds, strict=True) if k == "ResourceSlice"]
        classes = [o for o, k in zip(nodes, kinds, strict=True) if k == "DeviceClass"]
        others = [o for o, k in zip(nodes, kinds, strict=True) if k not in ("ResourceSlice", "DeviceClass")]
        records = [r for r in map(record, map(self.node_transform, others)) if r is not None]
        with self._lock:
            self._nodes = records
            if slices:
                self._devices = dra.node_devices(slices)
            if classes:
                self._classes = dra.classes_from_objects(classes)
            inv = self._build(self._nodes, self._snap.policy, trim=True)  # a bulk load: see _trim
            self._snap = Snapshot(self._snap.policy, inv, self._snap.namespaces, self._snap.resolve)
            self.status.inventory_source = source
            self.status.inventory_synced = synced

    def apply_node_changes(self, batch: Mapping[str, dict[str, Any] | NodeRecord | None]) -> None:
        """Node name -> its (cut-down) object, or None when deleted: only those nodes' entries change."""
        with self._lock:
            s = self._snap
            pools = s.policy.pools
            devices = self._devices
            served = self._classes.served_names if self._classes is not None else dra.BUILT_IN_EXTENDED
            changes = {
                key: inventory_mod.node_from_object(as_object(obj), pools, devices.get(key), served)
                if obj is not None
                else None
                for key, obj in batch.items()
            }
            self._snap = Snapshot(s.policy, s.inventory.apply(changes), s.namespaces, s.resolve)

    def _build(self, nodes: Iterable[dict[str, Any] | NodeRecord], policy: Policy, trim: bool = False) -> Inventory:
        return _build(nodes, policy, self._devices, self._classes, trim)

    def _node_objects(self) -> Iterable[NodeRecord]:
        refl = self._node_reflector
        return refl.snapshot().values() if refl is not None else self._nodes

    def set_namespaces(self, namespaces: dict[str, dict[str, str]]) -> None:
        with self._lock:
            s = self._snap
            self._snap = Snapshot(s.policy, s.inventory, namespaces, s.resolve)

    def set_resolver(self, resolve: Callable[[str, str, str], dict[str, Any] | None]) -> None:
        with self._lock:
            s = self._snap
            self._snap = Snapshot(s.policy, s.inventory, s.namespaces, resolve)

    def capacity(self) -> Capacity | None:
        """The pod view as the engine's Capacity, rebuilt only when the view changed (None: no view)."""
        view = self.pods
        if view is None:
            return None
        snap = view.snapshot()
        cap = self._capacity
        if cap is None or cap.version != snap.version:
            cap = self._capacity = capacity_of(snap)
        return cap

    def pod_entry(self, namespace: str, name: str) -> PodEntry | None:
        """The pod view's entry of one pod (None: no view, a pod with no GPU, or not seen yet)."""
        view = self.pods
        return view.get(f"{namespace}/{name}") if view is not None else None

    def load_pods(self, objects: list[dict[str, Any]], source: str) -> PodView:
        """A pod view from a fixed set of pods (a file): synced at once."""
        view = PodView(pod_facts, on_bound=self.reservations.bound, on_pending=self.reservations.pending)
        view.load({_file_key(i, obj): obj for i, obj in enumerate(objects)})  # by name: the bind check looks up
        self.pods, self.pods_source = view, source
        return view

    # -- sources --------------------------------------------------------------------------------------

    def load_policy_text(self, text: str, source: str) -> bool:
        """Load a policy edit, or report why not. Never raises: a watcher thread that died on a MemoryError or
        RecursionError would leave every later edit unloaded while /readyz said ready."""
        try:
            self.set_policy(parse_policy_text(text), source)
        except PolicyError as exc:
            self.policy_failed("; ".join(exc.errors[:5]), source)
            return False
        except Exception as exc:
            log.exception("policy reload failed", extra={"source": source})
            self.policy_failed(f"reload failed: {type(exc).__name__}: {str(exc)[:200]}", source)
            return False
        return True

    def watch_policy_file(self, path: str, interval: float = 1.0, settle: float = POLICY_SETTLE) -> None:
        """Load now (a bad file is a start-up error) and reload when the file changes, once its content has
        stayed the same for `settle` seconds: an editor or `cp` caught half-way is not served."""
        first = _stat(path)  # before the read: an edit made from now on is seen as a change
        with open(path, encoding="utf-8") as f:
            text = f.read(MAX_POLICY_BYTES + 1)
        self.set_policy(parse_policy_text(text), f"file:{path}")

        def loop() -> None:
            last = first
            while not self._stop.wait(interval):
                try:
                    now = _stat(path)
                    if now == last:
                        continue
                    text = _read_settled(path, settle, self._stop)
                    if text is None:
                        continue  # still being written (or stopping): look again next time
                    last = now
                    self.load_policy_text(text, f"file:{path}")
                except (OSError, UnicodeDecodeError) as exc:
                    last = now
                    self.policy_failed(f"cannot read {path}: {exc}", f"file:{path}")
                except Exception as exc:  # never a silent end of the watcher
                    log.exception("policy watcher failed", extra={"path": path})
                    self.policy_failed(f"reload failed: {type(exc).__name__}: {str(exc)[:200]}", f"file:{path}")

        threading.Thread(target=loop, name="policy-file", daemon=True).start()

    def watch_policy_configmap(self, client: Any, namespace: str, name: str) -> Any:
        from cluster.reflector import Reflector

        source = f"configmap:{namespace}/{name}"
        self.status.policy_source = source
        self.status.policy_loaded_at = 0.0  # not ready until the ConfigMap's policy has been read once

        def changed(*_: Any) -> None:
            cm = refl.get(f"{namespace}/{name}")
            if cm is None:
                self.policy_failed(f"ConfigMap {namespace}/{name} not found; keeping the last policy", source)
                return
            data = cm.get("data") or {}
            text = data.get(POLICY_KEY)
            if not isinstance(text, str):
                self.policy_failed(f"ConfigMap {namespace}/{name} has no data key {POLICY_KEY!r}", source)
                return
            self.load_policy_text(text, source)

        refl = Reflector(
            client,
            f"/api/v1/namespaces/{namespace}/configmaps",
            name="policy-configmap",
            field_selector=f"metadata.name={name}",
            on_change=changed,
        )
        self._reflectors.append(refl.start())
        return refl

    def watch_nodes(self, client: Any, interval: float = NODE_BATCH_INTERVAL) -> Any:
        """The first list builds the inventory at once; after it, each event goes through a Coalescer and
        updates only its node (relists after 410 Gone arrive as the differences, the same way)."""
        from cluster.reflector import Change, Reflector

        batches = self.node_batches = Coalescer(self.apply_node_changes, interval=interval, name="node-batches")
        built = self._nodes_built
        early = _EarlyNodes()
        # The first list is a bulk load: no cyclic GC until it is built (not ready, nothing else to serve yet).
        startup = gc_paused()
        startup.__enter__()

        def changed(change: Change) -> None:
            if change.type != "SYNCED":
                if not built.is_set():  # before the first list is complete, that list's build covers it
                    return
                if same_content(change.old, change.new):  # a status update: the inventory would be rebuilt as is
                    self.node_events_unchanged += 1
                else:
                    batches.put(change.key, change.new)
                return
            if not built.is_set():
                try:
                    with self._lock:
                        records: dict[str, Any] = refl.snapshot()
                        # _frozen collects the list's cyclic garbage, then freezes what is kept
                        inv = _frozen(lambda: early.build(records, self._snap.policy, self._devices, self._classes))
                        del records
                        self._snap = Snapshot(self._snap.policy, inv, self._snap.namespaces, self._snap.resolve)
                finally:
                    # The collector back on only now: on before the build, its first automatic collection
                    # scanned every object the list had made (a second full pass beside _frozen's).
                    startup.__exit__(None, None, None)
                built.set()
                early.clear()
            self.status.inventory_synced = True

        def transform(obj: Any) -> NodeRecord | None:
            rec = record(self.node_transform(obj))
            if rec is not None and not built.is_set():  # read while the next list page is on its way
                early.read(rec, self._snap.policy, self._devices, self._classes)
            return rec

        refl = Reflector(
            client,
            "/api/v1/nodes",
            name="nodes",
            on_change=changed,
            transform=transform,
            decoders=NODE_DECODERS,
            page_size=NODE_PAGE,
            key_of=_record_name,
            version_of=_record_version,
        )
        self._node_reflector = refl
        self.status.inventory_source = "watch:nodes"
        batches.start()
        self._reflectors.append(refl.start())
        return refl

    def watch_namespaces(self, client: Any) -> Any:
        from cluster.reflector import Reflector

        self.status.namespaces_synced = False

        def changed(*_: Any) -> None:
            labels = {}
            for obj in refl.snapshot().values():
                meta = obj.get("metadata") or {}
                labels[str(meta.get("name"))] = dict(meta.get("labels") or {})
            self.set_namespaces(labels)
            self.status.namespaces_synced = refl.synced

        refl = Reflector(client, "/api/v1/namespaces", name="namespaces", on_change=changed)
        self._reflectors.append(refl.start())
        return refl

    def watch_pods(self, client: Any) -> Any:
        """Keep the pod view current from a Pod list + watch over all namespaces (read-only). While the first
        Node list is still being built (watch_nodes), the pod watch starts after it (`_start_after_nodes`)."""
        from cluster.reflector import Reflector

        tracker = self.ledger
        note: Any = None
        if tracker is not None:  # the ledger's few fields ride in each GPU pod's entry (no second watch)
            from policies.ledger import pod_note

            note = pod_note
        view = PodView(
            pod_facts,
            on_bound=self.reservations.bound,
            note=note,
            read_claim=self._claim_held,
            on_pending=self.reservations.pending,  # a gang that will not bind soon ends its reservation
        )
        listed = threading.Event()

        def on_change(change: Any) -> None:  # after the view has the change
            if tracker is not None:
                tracker.apply(change)
            if change.type == "SYNCED" and not listed.is_set():  # once: the first list is a bulk load
                listed.set()
                gc.collect()  # the first list's pages, in reference cycles with their responses
                _trim()  # and the heap they took back to the OS: RSS would stay at the list's peak

        # Terminated pods hold nothing: the API server filters them out (phase is a supported field).
        refl = Reflector(
            client,
            "/api/v1/pods",
            name="pods",
            on_change=on_change,
            field_selector="status.phase!=Succeeded,status.phase!=Failed",
            transform=view.transform,  # a GPU pod's PodEntry, nothing of the others
            key_of=_entry_key,
            version_of=_entry_version,
            store=view,  # the view is the cache: one record per GPU pod, by column (cluster/podtable.py)
        )
        self.pods, self.pods_source = view, "watch:pods"
        self._reflectors.append(refl)
        self._start_after_nodes(refl)
        if tracker is not None:
            tracker.start(self._stop)
        return refl

    def _start_after_nodes(self, refl: Any) -> None:
        """Start the pod Reflector once the first Node list is in the inventory (at once without a Node watch),
        or when that list fails, or after POD_WATCH_WAIT seconds. Both first lists at once interleave what their
        pages leave behind with what the caches keep: ~17 MiB of half-used allocator pools at 50,000 nodes and
        500,000 pods (docs/benchmarks.md §4). Readiness does not wait for the pod view (placement counts
        allocatable GPUs until it is synced), so this costs start-up nothing but the pod view's later sync."""
        nodes = self._node_reflector
        if nodes is None or self._nodes_built.is_set():
            _start_pod_list(refl)
            return
        self.pods_waiting = True

        def start_later() -> None:
            deadline = time.monotonic() + POD_WATCH_WAIT
            while not self._nodes_built.wait(0.1):
                if self._stop.is_set():
                    return
                if nodes.last_error is not None or time.monotonic() > deadline:
                    break  # the Node list fails (forbidden, unreachable) or crawls: the pods need not wait on it
            self.pods_waiting = False
            if not self._stop.is_set():
                _start_pod_list(refl)  # a stop() between the test and here stopped `refl`: its thread ends at once

        threading.Thread(target=start_later, name="pods-after-nodes", daemon=True).start()

    def _claim_held(self, claim: Mapping[str, Any]) -> tuple[str, dict[str, int]]:
        """The pod view's claim reader: read with the DeviceClasses known now (a class edited later does not
        recount claims already allocated; classes change rarely and allocations turn over)."""
        classes = self._classes if self._classes is not None else dra.Classes()
        return dra.claim_held(dict(claim), classes)

    def watch_targets(self, client: Any) -> None:
        from cluster.reflector import Reflector

        for kind, path in TARGET_PATHS.items():
            self._targets[kind] = Reflector(client, path, name=kind.lower() + "s")
            self._reflectors.append(self._targets[kind].start())
        for kind, path in RUNTIME_PATHS.items():
            self._targets[kind] = Reflector(client, path, name=kind.lower() + "s", backoff_max=OPTIONAL_BACKOFF)
            self._reflectors.append(self._targets[kind].start())

        def resolve(kind: str, namespace: str, name: str) -> dict[str, Any] | None:
            refl = self._targets.get(kind)
            key = f"{namespace}/{name}" if namespace else name  # cluster-scoped objects: by name alone
            obj = refl.get(key) if refl is not None else None
            return obj if isinstance(obj, dict) else None

        self.set_resolver(resolve)

    def watch_exceptions(self, client: Any) -> Any:
        """Keep the GPUPolicyException index current (list + watch, all namespaces, read-only). Without the
        CRD the reflector retries with back-off and the index stays empty (reported in /readyz)."""
        from cluster.reflector import Reflector

        path = f"/apis/{exceptions_mod.API_VERSION}/{exceptions_mod.PLURAL}"
        refl = Reflector(client, path, name="exceptions", on_change=self.exceptions.apply)
        self.exceptions_source = "watch:" + exceptions_mod.PLURAL
        self._reflectors.append(refl.start())
        return refl

    def exceptions_in(self, namespace: str) -> tuple[exceptions_mod.Exemption, ...]:
        return self.exceptions.snapshot().get(namespace)

    def report_expired(self, now: float, refs: Iterable[str] = ()) -> int:
        """Log each expired exception once (those a review ran into, and any found in the index); the number
        of expired exceptions in the index now."""
        snap: IndexSnapshot[exceptions_mod.Exemption] = self.exceptions.snapshot()
        expired = {e.ref: e.until_text for es in snap.by_namespace.values() for e in es if e.expired(now)}
        for ref in refs:
            expired.setdefault(ref, "")
        for ref, until in expired.items():
            if ref not in self._expired_reported:
                self._expired_reported.add(ref)
                self.expired_reported += 1
                log.warning("exception expired: ignored", extra={"exception": ref, "until": until})
        return sum(1 for es in snap.by_namespace.values() for e in es if e.expired(now))

    def watch_dra(self, client: Any, slices: bool = True) -> bool:
        """When the cluster serves resource.k8s.io/v1: DeviceClasses and (with `slices`, i.e. when Nodes are
        watched too) ResourceSlices into the inventory, ResourceClaims and ResourceClaimTemplates into the
        resolver (read-only caches, cut down as decoded). Returns whether DRA is served."""
        from cluster import dra as cluster_dra
        from cluster.reflector import Change, Reflector

        ok, why = cluster_dra.served(client)
        self.dra_status = {"served": ok, **({"note": why} if why else {})}
        if not ok:
            log.info("DRA not watched", extra={"reason": why})
            return False

        def classes_changed(change: Change) -> None:
            if change.type != "SYNCED" and not classes.synced:
                return  # the first list's end (SYNCED) applies them all at once
            found = dra.classes_from_objects(classes.snapshot().values())
            with self._lock:
                self._classes = found
                s = self._snap
                # Rebuilt, not patched: which device offers pods may ask by name depends on the classes (rare).
                inv = self._build(self._node_objects(), s.policy)
                self._snap = Snapshot(s.policy, inv, s.namespaces, s.resolve)

        classes = Reflector(
            client,
            DRA_PATHS["DeviceClass"],
            name="deviceclasses",
            on_change=classes_changed,
            transform=cluster_dra.slim_class,
        )
        self._reflectors.append(classes.start())
        if slices:

            def slices_changed(change: Change) -> None:
                for node in self._slices.apply(change):
                    found = dra.node_devices(self._slices.slices(node))
                    with self._lock:
                        if node in found:
                            self._devices[node] = found[node]
                        else:
                            self._devices.pop(node, None)
                    refl, batches = self._node_reflector, self.node_batches
                    obj = refl.get(node) if refl is not None else None
                    if obj is not None and batches is not None:
                        batches.put(node, obj)  # the node's entry is rebuilt with its devices

            refl = Reflector(
                client,
                DRA_PATHS["ResourceSlice"],
                name="resourceslices",
                on_change=slices_changed,
                transform=slim_slice,
            )
            self._reflectors.append(refl.start())

        def claims_changed(change: Change) -> None:
            view = self.pods
            if view is not None:  # watch_pods runs first (cmd_serve): every claim change reaches the view
                view.apply_claim(change)

        self._targets["ResourceClaim"] = Reflector(
            client,
            DRA_PATHS["ResourceClaim"],
            name="resourceclaims",
            on_change=claims_changed,
            transform=cluster_dra.slim_claim,
        )
        self._targets["ResourceClaimTemplate"] = Reflector(
            client, DRA_PATHS["ResourceClaimTemplate"], name="resourceclaimtemplates", transform=slim_spec
        )
        for kind in ("ResourceClaim", "ResourceClaimTemplate"):
            self._reflectors.append(self._targets[kind].start())
        return True

    def ready(self) -> tuple[bool, dict[str, Any]]:
        snap = self._snap
        inv = snap.inventory
        details: dict[str, Any] = {
            "policy": {
                "hash": snap.policy.hash,
                "source": self.status.policy_source,
                "error": self.status.policy_error,
                "reloads": self.status.reloads,
                "reloadFailures": self.status.reload_failures,
            },
            "inventory": {
                "source": self.status.inventory_source,
                "synced": self.status.inventory_synced,
                "gpuNodes": inv.node_count,
                "rackLabel": inv.rack_label,
                "levels": inventory_mod.level_report(inv, snap.policy),
                "warnings": list(inv.warnings),
            },
            "namespacesSynced": self.status.namespaces_synced,
            "podView": self._pod_view_details(),
            "exceptions": self._exception_details(),
            "dra": self._dra_details(),
            **self.status.extra,
        }
        ok = (self.status.inventory_synced or self.status.inventory_source == "none") and self.status.namespaces_synced
        if self.status.policy_source.startswith("configmap:") and self.status.policy_loaded_at == 0.0:
            ok = False
        return ok, details

    def _dra_details(self) -> dict[str, Any]:
        classes = self._classes
        out = dict(self.dra_status)
        out["deviceClasses"] = len(classes.by_name) if classes is not None else None
        out["nodesWithDevices"] = len(self._devices)
        return out

    def _pod_view_details(self) -> dict[str, Any]:
        view = self.pods
        if view is None:
            return {"source": "none", "synced": False, "note": "no pod view: placement by allocatable only"}
        snap = view.snapshot()
        details: dict[str, Any] = {"source": self.pods_source, "synced": snap.synced, "gpuPods": snap.pods}
        details["gpuClaims"] = snap.claims
        details["skipped"] = snap.skipped
        if self.pods_waiting:
            details["note"] = "pod watch starts once the Node inventory is built: placement by allocatable only"
        elif not snap.synced:
            details["note"] = "pod view not synced yet: placement by allocatable only"
        return details

    def _exception_details(self) -> dict[str, Any]:
        snap = self.exceptions.snapshot()
        details: dict[str, Any] = {"source": self.exceptions_source, "synced": snap.synced, "count": len(snap)}
        if snap.skipped:
            details["skipped"] = dict(snap.skipped)
        return details

    def stop(self) -> None:
        self._stop.set()
        for r in self._reflectors:
            r.stop(timeout=1.0)
        if self.node_batches is not None:
            self.node_batches.stop()


def _file_key(i: int, obj: Any) -> str:
    """A pod of a file by its namespace/name, as the watch keys it; by its position when it has no name."""
    meta = obj.get("metadata") if isinstance(obj, dict) else None
    named = isinstance(meta, dict) and isinstance(meta.get("name"), str) and isinstance(meta.get("namespace"), str)
    return f"{meta['namespace']}/{meta['name']}" if named else f"#{i}"  # type: ignore[index]


def pod_fetcher(client: Any) -> Callable[[str, str], PodEntry | None]:
    """`State.fetch_pod` over `client`: one GET of the pod, read as the pod view reads it (None: a pod with no
    GPUs, or one the view could not read). Raises the client's KubeError (not found, refused, timed out)."""

    def fetch(namespace: str, name: str) -> PodEntry | None:
        obj = client.get(f"/api/v1/namespaces/{quote(namespace, safe='')}/pods/{quote(name, safe='')}")
        try:
            return pod_entry_of(obj, pod_facts)
        except (ValueError, TypeError, AttributeError):
            return None

    return fetch


def _record_name(r: NodeRecord) -> str:
    return r.name


def _record_version(r: NodeRecord) -> str | None:
    return r.version


def _entry_key(e: PodEntry) -> str:
    return e.key


def _entry_version(e: PodEntry) -> str | None:
    return e.version


def _build(
    nodes: Iterable[dict[str, Any] | NodeRecord],
    policy: Policy,
    devices: Mapping[str, dra.NodeDevices] | None = None,
    classes: dra.Classes | None = None,
    trim: bool = False,
) -> Inventory:
    """A whole inventory, built with the cyclic garbage collector paused, then frozen out of it: its containers
    have no cycles (refcounting frees them), and left in the oldest generation they would make every full
    collection scan them all, a pause of tens of milliseconds in the middle of an admission request. `trim`:
    after a bulk load only (see _trim)."""
    return _frozen(lambda: inventory_mod.build(map(as_object, nodes), policy, devices, classes), trim)


# A rebuild (a policy edit, a DeviceClass change) of a smaller inventory is not frozen: a full collection of it
# costs well under a millisecond, while freezing would also pin every object alive at that moment for good —
# the open connections, their TLS buffers, requests in flight —, and those in reference cycles would never be
# freed once closed (a soak reloading its policy every 5 s beside hundreds of connections grew by ~30 MiB).
# Bulk loads (a nodes file, the first Node list) are frozen whatever their size: they come before traffic.
FREEZE_MIN_NODES = 2_000


def _frozen(build: Callable[[], Inventory], trim: bool = True) -> Inventory:
    with gc_paused():
        inv = build()
    if trim or inv.node_count >= FREEZE_MIN_NODES:
        # Collect first: freezing would keep whatever cyclic garbage exists now forever (a paused list leaves
        # every page's HTTP response in a reference cycle; their bodies are not kept on them, see
        # KubeClient.request).
        gc.collect()
        gc.freeze()
    if trim:
        _trim()
    return inv


class _EarlyNodes:
    """Nodes of the first list read into inventory entries as their pages arrive (the next page is served
    meanwhile, see KubeClient.list_all), so the build after the list only indexes them. An entry is used
    only if read from the very object the list cached, with the same pools, devices and classes."""

    Devices = Mapping[str, dra.NodeDevices]

    def __init__(self) -> None:
        self.entries: dict[str, tuple[NodeRecord, tuple[Any, ...], inventory_mod.GpuNode | None]] = {}
        # (shared label set, shared status) -> (those two, the inputs, the entry read): a rack's nodes differ
        # only by name and hostname, and are read once (a third of the first list's CPU otherwise)
        self._alike: dict[tuple[int, int], tuple[Any, ...]] = {}

    def read(self, rec: NodeRecord, policy: Policy, devices: Devices, classes: dra.Classes | None) -> None:
        inputs = _node_inputs(rec.name, policy, devices, classes)
        self.entries[rec.name] = (rec, inputs, self._read(rec, inputs))

    def _read(self, rec: NodeRecord, inputs: tuple[Any, ...]) -> inventory_mod.GpuNode | None:
        labels, status = rec.labels, rec.status
        pools, node_devices, _ = inputs
        if not isinstance(labels, NodeLabels) or node_devices is not None or inventory_mod.hostname_pools(pools):
            return _read_node(rec, *inputs)
        key = (id(labels.base), id(status))
        hit = self._alike.get(key)
        if hit is not None and hit[0] is labels.base and hit[1] is status and all(map(operator.is_, hit[2], inputs)):
            like: inventory_mod.GpuNode | None = hit[3]
            return inventory_mod.renamed(like, rec.name, labels) if like is not None else None
        n = _read_node(rec, *inputs)
        self._alike[key] = (labels.base, status, inputs, n)  # holds both: their ids are not reused meanwhile
        return n

    def build(
        self, objects: Mapping[str, NodeRecord], policy: Policy, devices: Devices, classes: dra.Classes | None
    ) -> Inventory:
        found: dict[str, inventory_mod.GpuNode] = {}
        for key, obj in objects.items():
            inputs = _node_inputs(key, policy, devices, classes)
            hit = self.entries.get(key)
            if hit is not None and hit[0] is obj and all(a is b for a, b in zip(hit[1], inputs, strict=True)):
                n = hit[2]
            else:
                n = _read_node(obj, *inputs)
            if n is not None:
                found[key] = n
        return inventory_mod.from_nodes(found, policy, classes)

    def clear(self) -> None:
        self.entries, self._alike = {}, {}


def _node_inputs(
    name: str, policy: Policy, devices: Mapping[str, dra.NodeDevices], classes: dra.Classes | None
) -> tuple[Any, ...]:
    """What a node's inventory entry is read with besides its object."""
    return policy.pools, devices.get(name), classes


def _read_node(
    obj: NodeRecord, pools: Any, devices: dra.NodeDevices | None, classes: dra.Classes | None
) -> inventory_mod.GpuNode | None:
    served = classes.served_names if classes is not None else dra.BUILT_IN_EXTENDED
    return inventory_mod.node_from_object(obj.as_object(), pools, devices, served)


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """The cyclic garbage collector off for a bulk load (decoding a list, building an inventory): its full
    collections, triggered again and again by the allocations, would each scan everything loaded so far
    (3x the time of decoding 50,000 Node objects). Reference counting still frees everything acyclic."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


# glibc mmaps an allocation of at least this size, and unmaps it when freed (M_MMAP_THRESHOLD). Its default
# threshold is dynamic: it rises to the size of the largest mmapped block freed, so after the Node list's
# pages (~2 MB each: 100 heavy Nodes) everything below that comes from the heap. The first pod list then
# grows the pod table's columns (realloc moves them) and frees a 430 KB page every 500 pods between them:
# ~18 MiB of heap free but not returned at 50,000 nodes + 500,000 pods, the whole gap between the peak and
# the settled RSS (docs/benchmarks.md §4, session 9). Fixed from the first pod list on (the Node list is
# done by then: mmapping its pages cost it +13 % CPU), so large blocks go back to the OS when freed and
# grow by mremap.
POD_LIST_MMAP_THRESHOLD = 256 * 1024
_M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter


def _start_pod_list(refl: Any) -> None:
    _mallopt(_M_MMAP_THRESHOLD, POD_LIST_MMAP_THRESHOLD)
    refl.start()


def _mallopt(param: int, value: int) -> None:
    """glibc's mallopt; a no-op where there is no glibc."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").mallopt(param, value)


def _trim() -> None:
    """Give the list's freed pages back to the OS (glibc keeps them otherwise: RSS would stay at the list's
    peak). A no-op where there is no glibc.

    After a bulk load only (a nodes file, the first Node list), not on the rebuilds of a policy edit or a
    DeviceClass change: malloc_trim holds glibc's arena locks while it walks the heap, and the event loop's
    allocations wait for them (in the soak a 152 ms trim on a policy reload stalled the loop for 152 ms; it
    released the GIL, not the locks). A rebuild frees the old inventory to pymalloc, which reuses it."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)


def capacity_of(snap: PodSnapshot) -> Capacity:
    """The engine's view of a pod snapshot: whole GPUs held per node, and where each job's pods are."""
    return Capacity(
        used=snap.used_of(GPU),
        jobs=snap.jobs,
        synced=snap.synced,
        version=snap.version,
        source=snap.source,
        changed_since=snap.changed_since,
    )


def _read_settled(path: str, settle: float, stop: threading.Event) -> str | None:
    """The file's text if it reads the same (content and stat) before and after `settle` seconds, else None.
    Bounded: a file past the policy size limit is read only that far (the parser then reports it)."""
    before = _stat(path)
    with open(path, "rb") as f:
        first = f.read(MAX_POLICY_BYTES + 1)
    if stop.wait(settle):
        return None
    with open(path, "rb") as f:
        second = f.read(MAX_POLICY_BYTES + 1)
    if first != second or _stat(path) != before:
        return None
    return first.decode("utf-8")


def _stat(path: str) -> tuple[float, int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_mtime, st.st_size, st.st_ino)
