"""Reading Kubernetes manifests from files, directories and stdin: multi-document YAML or JSON, `kind: List`.

Errors are `ManifestError` with one line naming the file and, for YAML, the line: the CLI prints it as is.
Input is bounded (`Limits`): bytes read over all paths, objects, and per document the nesting depth and the
alias-expanded size (policies/limits.py), checked on the YAML event stream before any object is built, so
`/dev/zero`, an alias bomb or 100 MB of pods end in one line and exit 2 with bounded memory.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import yaml

from policies.limits import MAX_DEPTH, LimitError, check_yaml

try:  # libyaml's C loader is several times faster on large node lists; fall back to pure Python
    _Loader: Any = yaml.CSafeLoader
except AttributeError:  # pragma: no cover - depends on how PyYAML was built
    _Loader = yaml.SafeLoader

MANIFEST_SUFFIXES = (".yaml", ".yml", ".json")


@dataclass(frozen=True)
class Limits:
    """Bounds on one load. Parsed YAML takes ~10x its text in memory: 32 MiB of text stays under ~400 MiB
    (a `kubectl get nodes -o yaml` of ~5,000 nodes fits); raise them with `check --max-input/--max-objects`."""

    max_bytes: int = 32 * 2**20  # over all paths of one load
    max_objects: int = 20_000  # after `List` items are flattened; also the bound on YAML documents
    max_depth: int = MAX_DEPTH


DEFAULT_LIMITS = Limits()


class ManifestError(Exception):
    """Unreadable input: one line for the user."""


def _read(stream: IO[bytes], source: str, budget: int, limits: Limits) -> str:
    """At most `budget` bytes of text (one more byte is the error): never more in memory than the limit."""
    data = stream.read(budget + 1)
    if len(data) > budget:
        raise ManifestError(
            f"{source}: input exceeds the {limits.max_bytes}-byte limit over all inputs (raise it with --max-input)"
        )
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise ManifestError(f"{source}: not UTF-8 text") from None


def _expand(paths: Iterable[str], limits: Limits) -> Iterator[tuple[str, str]]:
    budget = limits.max_bytes
    for raw in paths:
        if raw == "-":
            text = _read(sys.stdin.buffer, "<stdin>", budget, limits)
            budget -= len(text.encode())
            yield "<stdin>", text
            continue
        path = Path(raw)
        if path.is_dir():
            files = sorted(p for p in path.rglob("*") if p.suffix in MANIFEST_SUFFIXES and p.is_file())
            if not files:
                raise ManifestError(f"{raw}: directory has no .yaml, .yml or .json files")
        else:
            files = [path]
        for f in files:
            try:
                with f.open("rb") as stream:
                    text = _read(stream, str(f), budget, limits)
            except FileNotFoundError:
                raise ManifestError(f"{f}: no such file") from None
            except IsADirectoryError:
                raise ManifestError(f"{f}: is a directory") from None
            except OSError as exc:
                raise ManifestError(f"{f}: {exc.strerror or exc}") from None
            budget -= len(text.encode())
            yield str(f), text


def parse_documents(text: str, source: str, limits: Limits = DEFAULT_LIMITS) -> list[Any]:
    """All YAML documents of a text (JSON is YAML), with empty documents dropped."""
    try:
        documents = check_yaml(text, source, max_depth=limits.max_depth, max_documents=limits.max_objects)
    except LimitError as exc:
        raise ManifestError(str(exc)) from None
    if documents > limits.max_objects:
        raise ManifestError(f"{source}: more than {limits.max_objects} documents (raise it with --max-objects)")
    try:
        return [d for d in yaml.load_all(text, Loader=_Loader) if d is not None]
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f":{mark.line + 1}:{mark.column + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise ManifestError(f"{source}{where}: invalid YAML: {problem}") from None


def load_objects(paths: Iterable[str], limits: Limits = DEFAULT_LIMITS) -> list[dict[str, Any]]:
    """Kubernetes objects from the given paths, in order, `List` kinds flattened."""
    out: list[dict[str, Any]] = []
    for source, text in _expand(paths, limits):
        for i, doc in enumerate(parse_documents(text, source, limits), start=1):
            out.extend(_objects(doc, f"{source} (document {i})"))
            if len(out) > limits.max_objects:
                raise ManifestError(f"{source}: more than {limits.max_objects} objects (raise it with --max-objects)")
    return out


def _objects(doc: Any, where: str) -> Iterator[dict[str, Any]]:
    if not isinstance(doc, dict):
        raise ManifestError(f"{where}: not a Kubernetes object (a mapping with apiVersion and kind)")
    kind = doc.get("kind")
    if isinstance(kind, str) and kind.endswith("List") and isinstance(doc.get("items"), list):
        for j, item in enumerate(doc["items"]):
            yield from _objects(item, f"{where} item {j}")
        return
    if not isinstance(kind, str) or not kind or not isinstance(doc.get("apiVersion"), str):
        raise ManifestError(f"{where}: missing apiVersion or kind")
    meta = doc.get("metadata")
    if meta is not None and not isinstance(meta, dict):
        raise ManifestError(f"{where}: metadata must be a mapping")
    yield doc
