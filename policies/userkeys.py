"""The `gpu-admission.io/` labels and annotations users write (spec §2), parsed strictly.

A value that does not parse, or an unknown key under our prefix, is an error reported by the
`gpu-admission-annotations` rule: users asked for a rejection rather than a silently ignored typo.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from policies.quantity import QuantityError, parse_bytes

PREFIX = "gpu-admission.io/"
WORKLOAD = PREFIX + "workload"
GPU_MEMORY = PREFIX + "gpu-memory"
LATENCY = PREFIX + "latency"
JOB_GPUS = PREFIX + "job-gpus"
# The job-identity label the webhook itself puts on pod templates of kinds whose controller sets none (RayJob,
# a labelled Deployment...); users may set it on bare pods too (the training-same-rack fix message says so).
JOB = PREFIX + "job"
ENFORCEMENT = PREFIX + "enforcement"
# Written by the webhook itself under `serve --native` (policies/native.py EXCEPTED_ANNOTATION), never by users:
# not a user key, so not read here and not "unknown" (whatever a user writes there the webhook replaces).
NATIVE_EXCEPTED = PREFIX + "native-excepted"

CLASSES = ("training", "inference", "batch")
LATENCIES = ("online", "offline")
MODES = ("enforce", "warn", "audit", "off")  # values of the namespace label ENFORCEMENT
LABEL_KEYS = frozenset({WORKLOAD, JOB})
ANNOTATION_KEYS = frozenset({GPU_MEMORY, LATENCY, JOB_GPUS})
# The hint for one of our keys written in the other section.
_MISPLACED = {"label": "; it is an annotation, not a label", "annotation": "; it is a label, not an annotation"}


@dataclass(frozen=True)
class UserKeys:
    workload: str | None = None
    gpu_memory: int | None = None  # bytes
    latency: str | None = None
    job_gpus: int | None = None
    errors: tuple[str, ...] = ()


def _meta(obj: Any, key: str) -> Mapping[str, Any]:
    meta = obj.get("metadata") if isinstance(obj, dict) else None
    value = meta.get(key) if isinstance(meta, dict) else None
    return value if isinstance(value, dict) else {}


NONE = UserKeys()  # what most objects carry: none of our keys (frozen, so shared)


def _mentions(obj: Any) -> bool:
    for section in ("labels", "annotations"):
        for key in _meta(obj, section):
            if isinstance(key, str) and key.startswith(PREFIX) and key != NATIVE_EXCEPTED:
                return True
    return False


def read(*objects: Any, where: tuple[str, ...] = ()) -> UserKeys:
    """Parse our keys from the metadata of each object in turn; later objects (pod templates) win.
    `where` names each object for error messages (e.g. "Job", "template worker")."""
    for obj in objects:
        if _mentions(obj):
            break
    else:
        return NONE
    values: dict[str, Any] = {}
    errors: list[str] = []
    for i, obj in enumerate(objects):
        place = f" on {where[i]}" if i < len(where) and where[i] else ""
        for kind, keys, other in (("label", LABEL_KEYS, ANNOTATION_KEYS), ("annotation", ANNOTATION_KEYS, LABEL_KEYS)):
            for key, raw in _meta(obj, kind + "s").items():
                if not isinstance(key, str) or not key.startswith(PREFIX) or key == NATIVE_EXCEPTED:
                    continue
                if key not in keys:
                    if key in other:
                        hint = _MISPLACED[kind]
                    elif key == ENFORCEMENT:
                        hint = "; it is a Namespace label"
                    else:
                        close = difflib.get_close_matches(key, sorted(keys), n=1, cutoff=0.75)
                        known = ", ".join(sorted(keys))
                        hint = f" (did you mean {close[0]}?)" if close else f"; known {kind}s: {known}"
                    errors.append(f"unknown {kind} {key}{place}{hint}")
                    continue
                parsed, err = _parse(key, raw)
                if err:
                    errors.append(f"{kind} {key}={raw!r}{place}: {err}")
                else:
                    values[key] = parsed
    return UserKeys(
        workload=values.get(WORKLOAD),
        gpu_memory=values.get(GPU_MEMORY),
        latency=values.get(LATENCY),
        job_gpus=values.get(JOB_GPUS),
        errors=tuple(errors),
    )


def _parse(key: str, raw: Any) -> tuple[Any, str]:
    if not isinstance(raw, str):
        return None, "must be a string"
    if key == WORKLOAD:
        return (raw, "") if raw in CLASSES else (None, f"must be one of {', '.join(CLASSES)}")
    if key == JOB:
        return (raw, "") if raw else (None, "must name the job (a non-empty label value)")
    if key == LATENCY:
        return (raw, "") if raw in LATENCIES else (None, f"must be one of {', '.join(LATENCIES)}")
    if key == JOB_GPUS:
        if raw.isascii() and raw.isdigit() and int(raw) > 0:
            return int(raw), ""
        return None, "must be a positive whole number of GPUs"
    if key == GPU_MEMORY:
        try:
            amount = parse_bytes(raw)
        except QuantityError as exc:
            return None, str(exc)
        if amount <= 0:
            return None, "must be a positive memory quantity such as 10Gi"
        return amount, ""
    return None, "unknown key"


def namespace_mode(labels: Mapping[str, str] | None, default: str) -> tuple[str, str | None]:
    """The enforcement mode of a namespace and, when its label is invalid, a warning."""
    if not labels or ENFORCEMENT not in labels:
        return default, None
    value = labels[ENFORCEMENT]
    if value in MODES:
        return value, None
    return default, f"namespace label {ENFORCEMENT}={value!r} is invalid (enforce|warn|audit|off); using {default}"
