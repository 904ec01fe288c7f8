"""The core is pure: `policies/` imports nothing from the web layer, HTTP or Kubernetes clients, and does
no I/O of its own. Checked two ways: statically (every import statement) and dynamically (importing the
whole package in a fresh interpreter loads none of the forbidden modules)."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
POLICIES = ROOT / "policies"
FORBIDDEN = (
    "webhook",
    "certs",
    "fastapi",
    "starlette",
    "uvicorn",
    "httpx",
    "kubernetes",
    "lightkube",
    "requests",
    "socket",
    "subprocess",
    "urllib",
    "http",
    "ssl",
    "asyncio",
)


def _imports(path: Path) -> list[tuple[int, str]]:
    tree = ast.parse(path.read_text(), filename=str(path))
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.append((node.lineno, node.module))
    return out


def test_policies_source_imports_nothing_forbidden() -> None:
    bad = [
        f"{path.relative_to(ROOT)}:{line} imports {name}"
        for path in sorted(POLICIES.rglob("*.py"))
        for line, name in _imports(path)
        if name.split(".")[0] in FORBIDDEN
    ]
    assert not bad, bad


def test_policies_source_does_no_io() -> None:
    """No open(), no printing: decisions go out as return values only. (Reading the built-in default
    policy from package data is the one exception, through importlib.resources in document.py.)"""
    bad = []
    for path in sorted(POLICIES.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("open", "print"):
                bad.append(f"{path.relative_to(ROOT)}:{node.lineno} calls {node.func.id}()")
    assert not bad, bad


def test_importing_the_engine_loads_no_forbidden_module() -> None:
    # urllib.parse is left out here: the standard library's pathlib loads it (for Path.as_uri).
    dynamic = tuple(m for m in FORBIDDEN if m != "urllib")
    code = (
        "import sys, pkgutil, importlib, policies\n"
        "for m in pkgutil.iter_modules(policies.__path__): importlib.import_module('policies.' + m.name)\n"
        f"bad = sorted(n for n in sys.modules if n.split('.')[0] in {dynamic!r})\n"
        "print(','.join(bad))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    assert out.stdout.strip() == "", f"importing policies loaded: {out.stdout.strip()}"


def test_the_boundary_test_would_catch_a_violation(tmp_path: Path) -> None:
    """The static check is not vacuous: a module importing the web layer is reported."""
    sample = tmp_path / "leak.py"
    sample.write_text("from webhook.app import create_app\nimport httpx\n")
    names = [name for _, name in _imports(sample)]
    assert [n for n in names if n.split(".")[0] in FORBIDDEN] == ["webhook.app", "httpx"]


CLUSTER = ROOT / "cluster"


def test_cluster_layer_imports_only_downwards() -> None:
    """cluster/ (client, reflectors, views) sits below the server and the CLIs: it imports neither, nor the
    decision engine, so one direction of imports holds (webhook, certs -> cluster)."""
    bad = [
        f"{path.relative_to(ROOT)}:{line} imports {name}"
        for path in sorted(CLUSTER.rglob("*.py"))
        for line, name in _imports(path)
        if name.split(".")[0] in ("webhook", "certs", "policies", "fastapi", "uvicorn")
    ]
    assert not bad, bad
