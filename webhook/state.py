"""What the server decides with, kept current off the request path: policy, GPU inventory, namespace labels,
and a read-only cache of HPA targets.

Readers take one consistent snapshot (`State.snapshot()`), an immutable tuple swapped atomically by the
watcher threads, so a request never blocks on the Kubernetes API or on a reload.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from policies import inventory as inventory_mod
from policies.document import Policy, PolicyError, default_policy, parse_policy_text
from policies.inventory import Inventory

log = logging.getLogger("gpu-admission.state")

POLICY_KEY = "policy.yaml"
# HPA / ScaledObject targets resolved from the cache; CRD targets fall back to classification by kind.
TARGET_PATHS = {"Deployment": "/apis/apps/v1/deployments", "StatefulSet": "/apis/apps/v1/statefulsets"}


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
        self._nodes: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        self.status = Status(policy_loaded_at=time.time())
        self._stop = threading.Event()
        self._reflectors: list[Any] = []
        self._targets: dict[str, Any] = {}
        self.on_policy_change: list[Callable[[Policy], None]] = []

    def snapshot(self) -> Snapshot:
        return self._snap

    # -- updates (watcher threads) --------------------------------------------------------------------

    def set_policy(self, policy: Policy, source: str) -> None:
        with self._lock:
            changed = policy.hash != self._snap.policy.hash
            inv = inventory_mod.build(self._nodes, policy)  # pools and rack label depend on the policy
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
        with self._lock:
            self._nodes = nodes
            inv = inventory_mod.build(nodes, self._snap.policy)
            self._snap = Snapshot(self._snap.policy, inv, self._snap.namespaces, self._snap.resolve)
            self.status.inventory_source = source
            self.status.inventory_synced = synced

    def set_namespaces(self, namespaces: dict[str, dict[str, str]]) -> None:
        with self._lock:
            s = self._snap
            self._snap = Snapshot(s.policy, s.inventory, namespaces, s.resolve)

    def set_resolver(self, resolve: Callable[[str, str, str], dict[str, Any] | None]) -> None:
        with self._lock:
            s = self._snap
            self._snap = Snapshot(s.policy, s.inventory, s.namespaces, resolve)

    # -- sources --------------------------------------------------------------------------------------

    def load_policy_text(self, text: str, source: str) -> bool:
        try:
            policy = parse_policy_text(text)
        except PolicyError as exc:
            self.policy_failed("; ".join(exc.errors[:5]), source)
            return False
        self.set_policy(policy, source)
        return True

    def watch_policy_file(self, path: str, interval: float = 1.0) -> None:
        """Load now (a bad file is a start-up error) and reload when the file changes."""
        with open(path, encoding="utf-8") as f:
            text = f.read()
        self.set_policy(parse_policy_text(text), f"file:{path}")

        def loop() -> None:
            last = _stat(path)
            while not self._stop.wait(interval):
                now = _stat(path)
                if now != last:
                    last = now
                    try:
                        with open(path, encoding="utf-8") as f:
                            self.load_policy_text(f.read(), f"file:{path}")
                    except (OSError, UnicodeDecodeError) as exc:
                        self.policy_failed(f"cannot read {path}: {exc}", f"file:{path}")

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

    def watch_nodes(self, client: Any) -> Any:
        from cluster.reflector import Reflector

        def changed(*_: Any) -> None:
            self.set_nodes(list(refl.snapshot().values()), "watch:nodes", synced=refl.synced)

        refl = Reflector(client, "/api/v1/nodes", name="nodes", on_change=changed)
        self.status.inventory_source = "watch:nodes"
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

    def watch_targets(self, client: Any) -> None:
        from cluster.reflector import Reflector

        for kind, path in TARGET_PATHS.items():
            self._targets[kind] = Reflector(client, path, name=kind.lower() + "s")
            self._reflectors.append(self._targets[kind].start())

        def resolve(kind: str, namespace: str, name: str) -> dict[str, Any] | None:
            refl = self._targets.get(kind)
            obj = refl.get(f"{namespace}/{name}") if refl is not None else None
            return obj if isinstance(obj, dict) else None

        self.set_resolver(resolve)

    def ready(self) -> tuple[bool, dict[str, Any]]:
        snap = self._snap
        inv = snap.inventory
        details: dict[str, Any] = {
            "policy": {
                "hash": snap.policy.hash,
                "source": self.status.policy_source,
                "error": self.status.policy_error,
                "reloads": self.status.reloads,
            },
            "inventory": {
                "source": self.status.inventory_source,
                "synced": self.status.inventory_synced,
                "gpuNodes": len(inv.nodes),
                "rackLabel": inv.rack_label,
                "warnings": list(inv.warnings),
            },
            "namespacesSynced": self.status.namespaces_synced,
            **self.status.extra,
        }
        ok = (self.status.inventory_synced or self.status.inventory_source == "none") and self.status.namespaces_synced
        if self.status.policy_source.startswith("configmap:") and self.status.policy_loaded_at == 0.0:
            ok = False
        return ok, details

    def stop(self) -> None:
        self._stop.set()
        for r in self._reflectors:
            r.stop(timeout=1.0)


def _stat(path: str) -> tuple[float, int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_mtime, st.st_size, st.st_ino)
