"""`serve --nodes FILE`: a fixed inventory read as the watch reads Nodes, cut down while decoded.

A `kubectl get nodes -o json` of 50,000 nodes is ~700 MB (images, managedFields, conditions). A JSON List
is mapped (never copied onto the heap) and decoded by cluster/nodes.py's `decode_list`, which builds only
what the inventory reads; the state then cuts each Node down with the watch's NodeTransform. Limits:
MAX_FILE_BYTES of JSON and MAX_NODES items. Anything else (YAML, one Node, a stream of documents) goes
through the manifest loader and its limits (32 MiB, 20,000 objects: YAML takes ~10x its text while parsed).
"""

from __future__ import annotations

import mmap
import os
from typing import Any

import orjson

from cluster.nodes import decode_list
from webhook.manifests import DEFAULT_LIMITS, ManifestError, load_objects

MAX_FILE_BYTES = 4 * 2**30  # a JSON List of ~250,000 heavy Nodes: mapped, not read onto the heap
MAX_NODES = 200_000  # the largest clusters run ~65,000 nodes


def load_node_file(path: str) -> list[Any]:
    """The Node objects of a nodes file (JSON Lists decoded cut down); `ManifestError` with one line."""
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if not f.read(4096).lstrip().startswith(b"{"):
                return _whole(path, size)
            if size > MAX_FILE_BYTES:
                raise ManifestError(f"{path}: larger than the {MAX_FILE_BYTES}-byte limit of a nodes file")
            with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
                items = _items(memoryview(mapped), path)
    except OSError as exc:
        raise ManifestError(f"{path}: {exc.strerror or exc}") from None
    if items is None:  # not a List: one Node, or something else, which the manifest loader judges
        return _whole(path, size)
    if len(items) > MAX_NODES:
        raise ManifestError(f"{path}: more than {MAX_NODES} nodes")
    return items


def _whole(path: str, size: int) -> list[Any]:
    """Through the manifest loader, whose limits `serve` has no flags for: say what to do instead."""
    if size > DEFAULT_LIMITS.max_bytes:
        raise ManifestError(
            f"{path}: larger than {DEFAULT_LIMITS.max_bytes} bytes and not a JSON NodeList "
            "(write it with kubectl get nodes -o json)"
        )
    return load_objects([path])


def _items(data: memoryview, path: str) -> list[Any] | None:
    try:
        with data:  # released before the mapping closes
            page = decode_list(data)
    except orjson.JSONDecodeError as exc:
        raise ManifestError(f"{path}: invalid JSON: {exc}") from None
    items = page.get("items") if isinstance(page, dict) else None
    return items if isinstance(items, list) else None
