"""Input limits shared by every parse path: nesting depth of JSON values, and a bounded YAML pre-scan.

Deeply nested input crashes parsers that recurse (PyYAML's composer recurses in C and segfaults; Python code
that walks objects hits RecursionError), and a YAML alias bomb is a few lines that expand to billions of
nodes in whatever copies the loaded object. So every parser of outside input checks these bounds first:
admission requests (`webhook/admission.py`), manifests (`webhook/manifests.py`), policies
(`policies/document.py`) and audit lines (`webhook/cmd_audit.py`). docs/deploy.md, "Limits", has the numbers.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

import orjson
import yaml

# Kubernetes objects nest about 20 levels (a JobSet's pod template affinity, inside an AdmissionReview);
# 100 leaves room for CRDs and stays far below where the engine's recursive copy would fail (~300).
MAX_DEPTH = 100
# Nodes of one YAML document after alias expansion: a `kind: List` of 5,000 Nodes is ~1M; an alias bomb
# expands to billions.
MAX_YAML_NODES = 2_000_000
# Of those, nodes that only exist through aliases: real manifests seldom use aliases at all, and whatever
# copies the loaded object (the engine does, to diff its mutations) pays for every expanded node.
MAX_ALIAS_NODES = 100_000

try:  # libyaml's parser is iterative and fast; the event stream is what the pre-scan reads
    _Parser: Any = yaml.CSafeLoader
except AttributeError:  # pragma: no cover - depends on how PyYAML was built
    _Parser = yaml.SafeLoader


class LimitError(ValueError):
    """Input past a documented limit: one line for the user (HTTP 400, exit 2, a reported reload failure)."""

    def __init__(self, source: str, event: Any, problem: str) -> None:
        mark = getattr(event, "start_mark", None)
        self.line = mark.line + 1 if mark is not None else 0
        self.column = mark.column + 1 if mark is not None else 0
        self.problem = problem
        super().__init__(
            f"{source}:{self.line}:{self.column}: {problem}" if mark is not None else f"{source}: {problem}"
        )


def json_too_deep(value: Any, limit: int = MAX_DEPTH) -> bool:
    """Whether a JSON value (as parsed: dicts, lists, scalars) nests containers deeper than `limit`; the
    top-level value is depth 1.

    On the request path this runs for every review, so it must cost far less than the review: orjson's
    serializer stops with "Recursion limit reached" past a fixed depth (found once, `_dumps_depth()`), so the
    value is serialized inside a prepared chain of lists that leaves it exactly `limit` levels of room. That
    is one C-speed pass (about a fifth of parsing the same text) instead of a Python walk (about three
    parses). Values orjson cannot serialize (an integer past 64 bits, which JSON and YAML both parse) and limits
    past orjson's use `walk_too_deep`."""
    if not isinstance(value, dict | list):
        return False
    room = _dumps_depth() - limit
    if room < 0:
        return walk_too_deep(value, limit)
    if room == 0:
        try:
            orjson.dumps(value)
        except orjson.JSONEncodeError as exc:
            return "Recursion limit" in str(exc) or walk_too_deep(value, limit)
        return False
    with _WRAP_LOCK:
        outer, inner = _wrapper(room)
        inner[0] = value
        try:
            orjson.dumps(outer)
        except orjson.JSONEncodeError as exc:
            return "Recursion limit" in str(exc) or walk_too_deep(value, limit)
        finally:
            inner[0] = None
    return False


def walk_too_deep(value: Any, limit: int = MAX_DEPTH) -> bool:
    """`json_too_deep` by an iterative walk (no recursion, so no RecursionError), for any nested value."""
    if not isinstance(value, dict | list):
        return False
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        node, depth = stack.pop()
        if depth > limit:
            return True
        children = node.values() if isinstance(node, dict) else node
        for child in children:
            if isinstance(child, dict | list):
                stack.append((child, depth + 1))
    return False


# room -> (outermost, innermost) of a chain of lists, each the only element of the one around it, `room`
# levels in all above the slot `innermost[0]` that takes the value to check. The lock keeps two threads
# from sharing a chain (orjson holds the GIL while it serializes, but the three statements around it do not).
_WRAPPERS: dict[int, tuple[list[Any], list[Any]]] = {}
_WRAP_LOCK = threading.Lock()
_DUMPS_DEPTH: list[int] = []


def _wrapper(room: int) -> tuple[list[Any], list[Any]]:
    if room not in _WRAPPERS:
        inner: list[Any] = [None]
        outer = inner
        for _ in range(room - 1):
            outer = [outer]
        _WRAPPERS[room] = (outer, inner)
    return _WRAPPERS[room]


def _dumps_depth() -> int:
    """The most levels of lists orjson serializes (254 for orjson 3.13), found by trying once."""
    if not _DUMPS_DEPTH:
        depth = 1
        value: list[Any] = [1]
        while depth < 4096:
            try:
                orjson.dumps([value])
            except orjson.JSONEncodeError:
                break
            value, depth = [value], depth + 1
        _DUMPS_DEPTH.append(depth)
    return _DUMPS_DEPTH[0]


@dataclass
class _Frame:
    anchor: str | None
    nodes: int = 1  # this collection and, so far, its children (aliases expanded)
    depth: int = 1  # levels below and including this one (aliases expanded)


def check_yaml(
    text: str,
    source: str,
    *,
    max_depth: int = MAX_DEPTH,
    max_nodes: int = MAX_YAML_NODES,
    max_alias_nodes: int = MAX_ALIAS_NODES,
    max_documents: int | None = None,
) -> int:
    """Read the YAML event stream (no objects built) and raise LimitError when a document nests deeper than
    `max_depth` or expands, aliases counted at their full size, to more than `max_nodes` nodes (more than
    `max_alias_nodes` of them through aliases). Returns the
    number of documents, stopping early at `max_documents + 1`. YAML syntax errors are left for the loader
    to report."""
    anchors: dict[str, tuple[int, int]] = {}  # anchor -> (nodes, depth) of the anchored node
    stack: list[_Frame] = []
    documents = 0
    total = 0  # nodes of the current document
    aliased = 0  # of which through aliases
    try:
        events = yaml.parse(text, Loader=_Parser)
        for event in events:
            if isinstance(event, yaml.CollectionStartEvent):
                stack.append(_Frame(event.anchor))
                if len(stack) > max_depth:
                    raise LimitError(source, event, f"nested deeper than {max_depth} levels")
                continue
            if isinstance(event, yaml.CollectionEndEvent):
                frame = stack.pop()
                nodes, depth, anchor = frame.nodes, frame.depth, frame.anchor
            elif isinstance(event, yaml.ScalarEvent):
                nodes, depth, anchor = 1, 0, event.anchor
            elif isinstance(event, yaml.AliasEvent):
                nodes, depth = anchors.get(str(event.anchor), (1, 0))
                anchor = None
                aliased += nodes
                if aliased > max_alias_nodes:
                    raise LimitError(source, event, f"aliases expand to more than {max_alias_nodes} nodes")
                if len(stack) + depth > max_depth:
                    raise LimitError(source, event, f"an alias nests deeper than {max_depth} levels")
            else:
                if isinstance(event, yaml.DocumentStartEvent):
                    documents += 1
                    if max_documents is not None and documents > max_documents:
                        return documents
                    total = aliased = 0
                    anchors.clear()
                continue
            if anchor is not None:
                anchors[anchor] = (nodes, depth)
            if stack:
                parent = stack[-1]
                parent.nodes += nodes
                parent.depth = max(parent.depth, depth + 1)
            total += 1 if not isinstance(event, yaml.AliasEvent) else nodes
            if total > max_nodes:
                raise LimitError(source, event, f"more than {max_nodes} nodes in one document (aliases expanded)")
    except yaml.YAMLError:
        return documents  # the loader reports the syntax error with its line
    return documents
