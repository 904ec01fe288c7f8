"""Reading Kubernetes manifests from files, directories and stdin: multi-document YAML or JSON, `kind: List`.

Errors are `ManifestError` with one line naming the file and, for YAML, the line: the CLI prints it as is.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import yaml

try:  # libyaml's C loader is several times faster on large node lists; fall back to pure Python
    _Loader: Any = yaml.CSafeLoader
except AttributeError:  # pragma: no cover - depends on how PyYAML was built
    _Loader = yaml.SafeLoader

MANIFEST_SUFFIXES = (".yaml", ".yml", ".json")


class ManifestError(Exception):
    """Unreadable input: one line for the user."""


def _expand(paths: Iterable[str]) -> Iterator[tuple[str, str]]:
    for raw in paths:
        if raw == "-":
            yield "<stdin>", sys.stdin.read()
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
                yield str(f), f.read_text(encoding="utf-8")
            except FileNotFoundError:
                raise ManifestError(f"{f}: no such file") from None
            except IsADirectoryError:
                raise ManifestError(f"{f}: is a directory") from None
            except UnicodeDecodeError:
                raise ManifestError(f"{f}: not UTF-8 text") from None
            except OSError as exc:
                raise ManifestError(f"{f}: {exc.strerror or exc}") from None


def parse_documents(text: str, source: str) -> list[Any]:
    """All YAML documents of a text (JSON is YAML), with empty documents dropped."""
    try:
        return [d for d in yaml.load_all(text, Loader=_Loader) if d is not None]
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f":{mark.line + 1}:{mark.column + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise ManifestError(f"{source}{where}: invalid YAML: {problem}") from None


def load_objects(paths: Iterable[str]) -> list[dict[str, Any]]:
    """Kubernetes objects from the given paths, in order, `List` kinds flattened."""
    out: list[dict[str, Any]] = []
    for source, text in _expand(paths):
        for i, doc in enumerate(parse_documents(text, source), start=1):
            out.extend(_objects(doc, f"{source} (document {i})"))
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
