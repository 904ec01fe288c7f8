"""The OpenReports `Report` CRD (openreports.io/v1alpha1) for the e2e harness, so the real API server validates
the reports `gpu-admission scan --report` writes.

Its schema is the upstream one (github.com/openreports/reports-api, config/crd/openreports.io_reports.yaml,
controller-gen v0.19.0, read at commit 769d978 of 2025-12-18): the same fields, types, enums and required
fields, written here without the descriptions. The reports are written with fieldValidation=Strict, so an
unknown or misspelt field is an error instead of being pruned.
"""

from __future__ import annotations

from typing import Any

RESULTS = ["pass", "fail", "warn", "error", "skip"]
SEVERITIES = ["critical", "high", "low", "medium", "info"]


def _object_reference() -> dict[str, Any]:
    fields = ("apiVersion", "fieldPath", "kind", "name", "namespace", "resourceVersion", "uid")
    return {
        "type": "object",
        "x-kubernetes-map-type": "atomic",
        "properties": {f: {"type": "string"} for f in fields},
    }


def _label_selector() -> dict[str, Any]:
    expression = {
        "type": "object",
        "required": ["key", "operator"],
        "properties": {
            "key": {"type": "string"},
            "operator": {"type": "string"},
            "values": {"type": "array", "items": {"type": "string"}, "x-kubernetes-list-type": "atomic"},
        },
    }
    return {
        "type": "object",
        "x-kubernetes-map-type": "atomic",
        "properties": {
            "matchExpressions": {"type": "array", "items": expression, "x-kubernetes-list-type": "atomic"},
            "matchLabels": {"type": "object", "additionalProperties": {"type": "string"}},
        },
    }


def schema() -> dict[str, Any]:
    result = {
        "type": "object",
        "required": ["policy"],
        "properties": {
            "category": {"type": "string"},
            "message": {"type": "string"},
            "policy": {"type": "string"},
            "properties": {"type": "object", "additionalProperties": {"type": "string"}},
            "resourceSelector": _label_selector(),
            "resources": {"type": "array", "items": _object_reference()},
            "result": {"type": "string", "enum": RESULTS},
            "rule": {"type": "string"},
            "scored": {"type": "boolean"},
            "severity": {"type": "string", "enum": SEVERITIES},
            "source": {"type": "string"},
            "timestamp": {
                "type": "object",
                "required": ["nanos", "seconds"],
                "properties": {
                    "nanos": {"type": "integer", "format": "int32"},
                    "seconds": {"type": "integer", "format": "int64"},
                },
            },
        },
    }
    counts = {k: {"type": "integer"} for k in RESULTS}
    return {
        "type": "object",
        "properties": {
            "apiVersion": {"type": "string"},
            "kind": {"type": "string"},
            "metadata": {"type": "object"},
            "configuration": {
                "type": "object",
                "required": ["limits"],
                "properties": {
                    "limits": {
                        "type": "object",
                        "properties": {
                            "maxResults": {"type": "integer"},
                            "statusFilter": {"type": "array", "items": {"type": "string", "enum": RESULTS}},
                        },
                    }
                },
            },
            "results": {"type": "array", "items": result},
            "scope": _object_reference(),
            "scopeSelector": _label_selector(),
            "source": {"type": "string"},
            "summary": {"type": "object", "properties": counts},
        },
    }


def crd() -> dict[str, Any]:
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": "reports.openreports.io"},
        "spec": {
            "group": "openreports.io",
            "scope": "Namespaced",
            "names": {
                "kind": "Report",
                "listKind": "ReportList",
                "plural": "reports",
                "singular": "report",
                "shortNames": ["rep"],
            },
            "versions": [
                {"name": "v1alpha1", "served": True, "storage": True, "schema": {"openAPIV3Schema": schema()}}
            ],
        },
    }


def install(cp: Any) -> None:
    cp.kubectl("apply", "-f", "-", input=crd())
    cp.kubectl("wait", "--for=condition=Established", "crd/reports.openreports.io", "--timeout=60s")
