"""Run generated admission policies through the API server's own CEL code (tests/celeval, a Go program on
k8s.io/apiserver of the e2e control plane's release), without a control plane.

`evaluate(policy, objects)` gives, per object, whether the policy's matchConditions matched, its validations'
verdicts and messages (a ValidatingAdmissionPolicy) and the object after its JSONPatch mutations (a
MutatingAdmissionPolicy), or why the API server would refuse the object before admission (`admitted` gives
that alone). Bindings are plain namespace selectors: `selects` applies one to a namespace's labels.
"""

from __future__ import annotations

import atexit
import json
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.gobuild import GoProgram

CELEVAL = GoProgram(Path(__file__).resolve().parent / "celeval", "celeval", "celeval")


@dataclass(frozen=True)
class Outcome:
    matched: bool
    object: dict[str, Any] | None  # as the policies saw it, after a MutatingAdmissionPolicy's patches
    validations: tuple[tuple[bool, str], ...]  # (passed, message) per validation
    refused: str  # why the API server refuses the object before any admission ('' when it reaches them)
    error: str


class CelevalError(RuntimeError):
    pass


def resource_of(obj: dict[str, Any]) -> dict[str, str]:
    """The resource an object of a kind the native policies match is served as (every one is its kind's
    lower-case plural)."""
    group, _, version = str(obj.get("apiVersion", "")).rpartition("/")
    return {"group": group, "version": version, "resource": str(obj.get("kind", "")).lower() + "s"}


class _Process:
    """One celeval process per test process (a policy is compiled once in it). A forked child (mutmut runs each
    mutant in one) starts its own: a pipe shared with the parent would mix answers."""

    def __init__(self) -> None:
        self.proc: subprocess.Popen[str] | None = None
        self.pid = 0

    def ask(self, request: dict[str, Any]) -> dict[str, Any]:
        if self.proc is None or self.pid != os.getpid() or self.proc.poll() is not None:
            self.proc = subprocess.Popen(
                [str(CELEVAL.build(CelevalError))],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            self.pid = os.getpid()
            atexit.register(self.proc.kill)
        assert self.proc.stdin is not None and self.proc.stdout is not None
        try:
            self.proc.stdin.write(json.dumps(request) + "\n")
            self.proc.stdin.flush()
            line = self.proc.stdout.readline()
        except BrokenPipeError:
            line = ""
        if not line:
            self.proc.kill()
            _, err = self.proc.communicate(timeout=10)
            raise CelevalError(f"celeval exited {self.proc.returncode}: {err.strip()[-2000:]}")
        answer: dict[str, Any] = json.loads(line)
        return answer


_PROCESS = _Process()


def _run(policy: dict[str, Any] | None, reviews: list[dict[str, Any]]) -> list[Outcome]:
    return [
        Outcome(
            matched=r.get("matched", False),
            object=r.get("object"),
            validations=tuple((v.get("passed", False), v.get("message", "")) for v in r.get("validations") or []),
            refused=r.get("refused", ""),
            error=r.get("error", ""),
        )
        for r in _PROCESS.ask({"policy": policy, "reviews": reviews})["results"]
    ]


def evaluate(
    policy: dict[str, Any], objects: list[dict[str, Any]], operation: str = "CREATE", namespace: str = "ml"
) -> list[Outcome]:
    """Each object reviewed by this policy (as a request of this operation in this namespace)."""
    return _run(policy, [_review(o, operation, namespace) for o in objects])


def admitted(objects: list[Any]) -> list[Outcome]:
    """Each object as the API server hands it to admission (a built-in kind decoded into its type and back),
    or why it is refused first."""
    return _run(None, [_review(o, "CREATE", "ml") for o in objects])


def _review(obj: Any, operation: str, namespace: str) -> dict[str, Any]:
    resource = resource_of(obj) if isinstance(obj, dict) else {}
    return {"operation": operation, "namespace": namespace, "resource": resource, "object": obj}


def selects(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    """A label selector of matchExpressions (In / NotIn, the only operators the generated bindings use)."""
    for e in selector.get("matchExpressions") or []:
        value = labels.get(e["key"])
        if e["operator"] == "In" and value not in e["values"]:
            return False
        if e["operator"] == "NotIn" and value in e["values"]:
            return False
        if e["operator"] not in ("In", "NotIn"):
            raise ValueError(f"operator {e['operator']} not handled here")
    return True


if __name__ == "__main__":  # `python -m tests.celeval`: build it now (make test's set-up), print its path
    print(CELEVAL.build(CelevalError))
