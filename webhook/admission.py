"""The AdmissionReview (admission.k8s.io/v1) wire format: parse a request, build a response, as plain JSON.

No Python Kubernetes client models AdmissionReview, and round-tripping objects through typed models would
drop unknown fields, so everything here is dicts. Facts from shared/reference/admission-contract.md.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass
from typing import Any

import orjson

from policies.limits import MAX_DEPTH, json_too_deep

API_VERSION = "admission.k8s.io/v1"
KIND = "AdmissionReview"
WARNING_MAX = 120  # the API server accepts longer, but kubectl lines and the 4 KiB total favour short ones
WARNINGS_TOTAL_MAX = 4096


class BadRequest(Exception):
    """A malformed AdmissionReview: HTTP 400 with this one-line message."""


@dataclass(frozen=True)
class Request:
    uid: str
    operation: str
    object: Any
    old_object: Any
    namespace: str
    name: str
    kind: str
    dry_run: bool
    user: str
    groups: tuple[str, ...]


def parse(body: bytes) -> Request:
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        msg = str(exc).splitlines()[0] if str(exc) else "invalid JSON"
        if "utf-8" in msg.lower() or "surrogate" in msg.lower():
            raise BadRequest("request body is not valid UTF-8") from None
        raise BadRequest(f"request body is not valid JSON: {msg}") from None
    if json_too_deep(doc):
        raise BadRequest(f"request body nests deeper than {MAX_DEPTH} levels")
    if not isinstance(doc, dict):
        raise BadRequest("request body must be a JSON object (an AdmissionReview)")
    if doc.get("apiVersion") != API_VERSION or doc.get("kind") != KIND:
        raise BadRequest(
            f"expected apiVersion {API_VERSION} kind {KIND}, got {doc.get('apiVersion')!r} {doc.get('kind')!r}"
        )
    req = doc.get("request")
    if not isinstance(req, dict):
        raise BadRequest("AdmissionReview has no request")
    uid = req.get("uid")
    if not isinstance(uid, str) or not uid:
        raise BadRequest("request.uid is missing or empty")
    op = req.get("operation")
    if op not in ("CREATE", "UPDATE", "DELETE", "CONNECT"):
        raise BadRequest(f"request.operation must be CREATE, UPDATE, DELETE or CONNECT, got {op!r}")
    kind = req.get("kind")
    raw_user = req.get("userInfo")
    user: dict[str, Any] = raw_user if isinstance(raw_user, dict) else {}
    raw_groups = user.get("groups")
    groups: list[Any] = raw_groups if isinstance(raw_groups, list) else []
    return Request(
        uid=uid,
        operation=op,
        object=req.get("object"),
        old_object=req.get("oldObject"),
        namespace=_str(req.get("namespace")),
        name=_str(req.get("name")),
        kind=kind.get("kind", "") if isinstance(kind, dict) else "",
        dry_run=req.get("dryRun") is True,
        user=str(user.get("username", "")),
        groups=tuple(str(g) for g in groups),
    )


def _str(value: Any) -> str:
    return value if isinstance(value, str) else ""


def clean_warnings(warnings: list[str] | tuple[str, ...]) -> list[str]:
    """Warnings the API server will keep: no control characters, short, de-duplicated, within 4 KiB."""
    out: list[str] = []
    total = 0
    for w in warnings:
        w = " ".join(w.split())
        if len(w) > WARNING_MAX:
            w = w[: WARNING_MAX - 1] + "…"
        if not w or w in out:
            continue
        total += len(w.encode())
        if total > WARNINGS_TOTAL_MAX:
            break
        out.append(w)
    return out


def response(
    uid: str,
    *,
    allowed: bool,
    message: str = "",
    patch: list[dict[str, Any]] | tuple[dict[str, Any], ...] = (),
    warnings: list[str] | tuple[str, ...] = (),
    audit: dict[str, str] | None = None,
    code: int = 403,
) -> dict[str, Any]:
    resp: dict[str, Any] = {"uid": uid, "allowed": allowed}
    if not allowed:
        resp["status"] = {"code": max(code, 400), "message": " ".join(message.split()) or "denied"}
    if patch:
        resp["patchType"] = "JSONPatch"
        resp["patch"] = base64.b64encode(orjson.dumps(list(patch))).decode()
    w = clean_warnings(warnings)
    if w:
        resp["warnings"] = w
    if audit:
        resp["auditAnnotations"] = audit
    return {"apiVersion": API_VERSION, "kind": KIND, "response": resp}
