"""Build a Go program of this repository's tests into the cache, once per change of its sources.

The binary goes to ``${GPU_ADMISSION_CACHE:-$HOME/.cache/gpu-admission}/<subdir>/<name>`` and is rebuilt
whenever the hash of its sources (``*.go``, ``go.mod``, ``go.sum``) and of `go version` changes. Used for the
benchmarks' load generator (tests/bench/loadgen, standard library only) and the CEL evaluator of the native
policies' unit tests (tests/celeval, the API server's own CEL code: its modules come from the Go module proxy
on the first build).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path


class GoBuildError(RuntimeError):
    pass


def cache_root() -> Path:
    return Path(os.environ.get("GPU_ADMISSION_CACHE") or str(Path.home() / ".cache" / "gpu-admission"))


def go() -> str:
    path = shutil.which("go")
    if not path:
        raise GoBuildError("the Go toolchain is not on PATH (needed to build the Go programs under tests/)")
    return path


@dataclass(frozen=True)
class GoProgram:
    source_dir: Path
    name: str
    subdir: str
    timeout: float = 3600.0  # a first build of the API server's packages on 2 busy cores takes minutes

    def cache_dir(self) -> Path:
        return cache_root() / self.subdir

    def source_hash(self, go_path: str) -> str:
        h = hashlib.sha256()
        for path in sorted(self.source_dir.iterdir()):
            if path.is_file() and (path.suffix == ".go" or path.name in ("go.mod", "go.sum")):
                h.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
        version = subprocess.run([go_path, "version"], capture_output=True, text=True, check=False).stdout.strip()
        h.update(version.encode())
        return h.hexdigest()

    def build(self, error: type[Exception] = GoBuildError, force: bool = False) -> Path:
        """The path of an up-to-date binary (built now if missing or stale); a failed build raises `error`."""
        try:
            go_path = go()
        except GoBuildError as exc:
            raise error(str(exc)) from None
        out_dir = self.cache_dir()
        binary = out_dir / self.name
        stamp = out_dir / f"{self.name}.sha256"
        digest = self.source_hash(go_path)
        if not force and binary.is_file() and stamp.is_file() and stamp.read_text().strip() == digest:
            return binary
        out_dir.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f"{self.name}-", dir=out_dir)) / self.name
        env = dict(os.environ, CGO_ENABLED="0", GOTOOLCHAIN="local", GOWORK="off")
        try:
            proc = subprocess.run(
                [go_path, "build", "-trimpath", "-o", str(tmp), "."],
                cwd=self.source_dir,
                env=env,
                capture_output=True,
                text=True,
                check=False,
                timeout=self.timeout,
            )
        except subprocess.TimeoutExpired:
            raise error(f"go build of {self.source_dir} took over {self.timeout:.0f} s") from None
        if proc.returncode != 0:
            raise error(f"go build of {self.source_dir} failed:\n{proc.stderr.strip()[-2000:]}")
        tmp.replace(binary)  # atomic: a concurrent reader sees the old or the new binary, never half of one
        shutil.rmtree(tmp.parent, ignore_errors=True)
        stamp.write_text(digest + "\n")
        return binary
