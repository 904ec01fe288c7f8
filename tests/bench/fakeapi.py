"""A fake Kubernetes API server for the scale benchmark: list + watch of a generated cluster over plain HTTP.

`python -m tests.bench.fakeapi --nodes 50000 --port 18080` serves:
- GET /api/v1/nodes?limit=&continue= : pages of clustergen's heavy Node objects (each ~20 KB as a kubelet
  writes them), generated page by page;
- GET /api/v1/pods?limit=&continue= : pages of `--pods` GPU pods (`pod(i)`: one GPU each on a GPU node, 8 to
  a job; ~1 KB as the API server sends a small pod), for the pod view's memory;
- GET /api/v1/nodes?watch=true : MODIFIED events at the storm rate (0 until set), one in ten changing a
  label (a health label flipping), the rest heartbeat-like (new resourceVersion and conditions, same labels);
- GET /_storm?rate=N : set the storm rate (events per second on each node watch);
- GET /_stats : events sent so far;
- any other list: empty; any other watch: held open until its timeoutSeconds.

It is a separate process so that generating and serialising 1,000 events a second does not run in the
measured server's interpreter. The real kube-apiserver serves the same list + watch protocol (tests/e2e).
"""

from __future__ import annotations

import argparse
import random
import threading
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import orjson

from tests.bench import clustergen

TICK = 0.01  # seconds between event bursts
EVENT_POOL = 2000  # distinct pre-serialised events cycled through (serialising on the fly would cost the rate)


class Cluster:
    def __init__(self, nodes: int, seed: int = 7, pods: int = 0) -> None:
        self.nodes = nodes
        self.pods = pods
        self.gpu_nodes = [i for i in range(nodes) if clustergen.rack_kind(i // clustergen.PER_RACK) != "cpu"]
        self.rate = 0.0
        self.sent = 0
        self.lock = threading.Lock()
        self.closing = threading.Event()
        rng = random.Random(seed)
        self.events: list[bytes] = []
        for k in range(EVENT_POOL):
            obj = clustergen.node(rng.randrange(nodes), heavy=True, generation=k + 1)
            obj["metadata"]["resourceVersion"] = str(10_000_000 + k)
            if k % 10 == 0:
                obj["metadata"]["labels"]["gpu-admission.example/health"] = "degraded" if k % 20 else "ok"
            self.events.append(orjson.dumps({"type": "MODIFIED", "object": obj}) + b"\n")

    def page(self, start: int, limit: int) -> bytes:
        end = min(self.nodes, start + limit)
        meta: dict[str, Any] = {"resourceVersion": "1000"}
        if end < self.nodes:
            meta["continue"] = str(end)
        items = [clustergen.node(i, heavy=True) for i in range(start, end)]
        return orjson.dumps({"kind": "NodeList", "apiVersion": "v1", "metadata": meta, "items": items})

    def pod_page(self, start: int, limit: int) -> bytes:
        end = min(self.pods, start + limit)
        meta: dict[str, Any] = {"resourceVersion": "1000"}
        if end < self.pods:
            meta["continue"] = str(end)
        items = [self.pod(i) for i in range(start, end)]
        return orjson.dumps({"kind": "PodList", "apiVersion": "v1", "metadata": meta, "items": items})

    def pod(self, i: int) -> dict[str, Any]:
        node = clustergen.node(self.gpu_nodes[i % len(self.gpu_nodes)])["metadata"]["name"]
        job = f"train-{i // 8:06d}"
        bound = CREATED + i // 8 + i % 8 // 3
        return {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": f"{job}-worker-{i % 8}",
                "namespace": f"team-{i // 8 % 50:02d}",  # a job's pods share its namespace
                "uid": f"00000000-0000-4000-9000-{i:012d}",
                "resourceVersion": str(2_000_000 + i),
                "labels": {"batch.kubernetes.io/job-name": job, "app": "trainer"},
                # A job's pods are created in the same second, long before the server starts (the ledger
                # leaves them alone), and bound over up to three seconds (what the ledger's notes keep).
                "creationTimestamp": _stamp(CREATED + i // 8),
                "ownerReferences": [
                    {"apiVersion": "batch/v1", "kind": "Job", "name": job, "uid": f"job-{i // 8}", "controller": True}
                ],
            },
            "spec": {
                "nodeName": node,
                "schedulerName": "default-scheduler",
                "containers": [
                    {
                        "name": "trainer",
                        "image": "nvcr.io/nvidia/pytorch:24.08-py3",
                        "resources": {"limits": {"nvidia.com/gpu": "1"}, "requests": {"nvidia.com/gpu": "1"}},
                    }
                ],
            },
            "status": {
                "phase": "Running",
                "podIP": f"10.{i >> 16 & 255}.{i >> 8 & 255}.{i & 255}",
                "conditions": [
                    {"type": "PodScheduled", "status": "True", "lastTransitionTime": _stamp(bound)},
                    {"type": "Ready", "status": "True", "lastTransitionTime": _stamp(CREATED + i // 8 + 30)},
                ],
            },
        }


CREATED = 1_764_000_000  # 2025-11-24: the pods' creation times start here


def _stamp(t: int) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t))


def handler(cluster: Cluster) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:
            pass

        def _send(self, body: bytes, status: int = 200) -> None:
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self) -> None:
            url = urllib.parse.urlsplit(self.path)
            q = dict(urllib.parse.parse_qsl(url.query))
            if url.path == "/_storm":
                cluster.rate = float(q.get("rate", "0"))
                return self._send(b"{}")
            if url.path == "/_stats":
                return self._send(orjson.dumps({"sent": cluster.sent, "rate": cluster.rate}))
            if q.get("watch") == "true":
                return self._watch(url.path, float(q.get("timeoutSeconds", "300")))
            if url.path == "/api/v1/nodes":
                start = int(q.get("continue") or 0)
                return self._send(cluster.page(start, int(q.get("limit") or cluster.nodes)))
            if url.path == "/api/v1/pods" and cluster.pods:
                start = int(q.get("continue") or 0)
                return self._send(cluster.pod_page(start, int(q.get("limit") or cluster.pods)))
            return self._send(orjson.dumps({"kind": "List", "metadata": {"resourceVersion": "1000"}, "items": []}))

        def _watch(self, path: str, timeout: float) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            deadline = time.monotonic() + timeout
            owed = 0.0
            k = 0
            try:
                while time.monotonic() < deadline and not cluster.closing.is_set():
                    time.sleep(TICK)
                    if path != "/api/v1/nodes" or cluster.rate <= 0:
                        owed = 0.0
                        continue
                    owed += cluster.rate * TICK
                    n, owed = int(owed), owed - int(owed)
                    if not n:
                        continue
                    chunk = b"".join(cluster.events[(k + i) % EVENT_POOL] for i in range(n))
                    k += n
                    self.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                    self.wfile.flush()
                    with cluster.lock:
                        cluster.sent += n
                self.wfile.write(b"0\r\n\r\n")
            except (BrokenPipeError, ConnectionResetError):
                pass
            self.close_connection = True

    return Handler


def main() -> None:
    ap = argparse.ArgumentParser(prog="python -m tests.bench.fakeapi", description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=50_000)
    ap.add_argument("--pods", type=int, default=0)
    ap.add_argument("--port", type=int, required=True)
    ns = ap.parse_args()
    cluster = Cluster(ns.nodes, pods=ns.pods)
    httpd = ThreadingHTTPServer(("127.0.0.1", ns.port), handler(cluster))
    httpd.daemon_threads = True
    print("ready", flush=True)
    httpd.serve_forever()


if __name__ == "__main__":
    main()
