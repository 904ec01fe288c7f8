"""`gpu-admission --version` prints the installed distribution's version, which is pyproject.toml's and the
one the server reports on /version (webhook.app.VERSION)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from webhook.app import VERSION

ROOT = Path(__file__).resolve().parent.parent


def test_version_flag_matches_pyproject_and_server() -> None:
    match = re.search(r'^version = "([^"]+)"', (ROOT / "pyproject.toml").read_text(), re.M)
    assert match is not None
    proc = subprocess.run([sys.executable, "-m", "webhook", "--version"], capture_output=True, text=True, check=False)
    assert (proc.returncode, proc.stdout, proc.stderr) == (0, f"gpu-admission {match.group(1)}\n", "")
    assert match.group(1) == VERSION
