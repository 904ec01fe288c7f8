"""Input limits shared by every parse path: nesting depth of JSON values, and a bounded YAML pre-scan.

Deeply nested input crashes parsers that recurse (PyYAML's composer recurses in C and segfaults; Python code
that walks objects hits RecursionError), and a YAML alias bomb is a few lines that expand to billions of
nodes in whatever copies the loaded object. So every parser of outside input checks these bounds first:
admission requests (`webhook/admission.py`), manifests (`webhook/manifests.py`), policies
(`policies/document.py`) and audit lines (`webhook/cmd_audit.py`). docs/deploy.md, "Limits", has the numbers.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

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
    """Whether a parsed JSON value nests containers deeper than `limit` (the top-level value is depth 1).

    Iterative, and it stops at the first container past the limit, so a hostile value costs at most one
    walk of what lies within the limit."""
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


def json_bytes_too_deep(raw: bytes, value: Any, limit: int = MAX_DEPTH) -> bool:
    """`json_too_deep` with a shortcut: a text with fewer brackets than `limit` cannot nest deeper, and
    counting them runs at memory speed (most admission requests take this path)."""
    if raw.count(b"{") + raw.count(b"[") <= limit:
        return False
    return json_too_deep(value, limit)


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
