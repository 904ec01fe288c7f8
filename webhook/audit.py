"""The audit log: one JSON line per admission decision, written off the request path.

`AuditLog.record()` is what the request path calls. It never waits for I/O: it appends the record to a
bounded in-memory queue and returns; it wakes the writer thread only when the writer is idle (the queue was
empty), so a busy server pays no thread wake-up per record. The writer, once woken, waits `linger` (5 ms by
default) for more records to join the first, takes everything queued as one batch, encodes each record with
orjson and writes the whole batch of lines with one `os.write` to an `O_APPEND` file descriptor (and/or to
fd 1, stdout, in writes of at most `PIPE_BUF` bytes). Nothing is buffered in userspace after the queue, so a
line the writer has written is in the kernel and survives the process being killed (`kill -9`, OOM kill);
only a machine crash can lose it. Each write holds whole lines only.

Flush latency: a record reaches the file (or stdout) at most `linger` after `record()` returned, plus the
time to write what is queued ahead of it (microseconds per record; longer only during a rotation with
compression, or when the disk or pipe stalls). `flush()` and `close()` cut the linger short.

Queue-full policy: when the queue holds `queue_size` records not yet written (the disk stalls, stdout is a
full pipe nobody reads), `record()` drops the new record and counts it in `dropped`. The alternative, blocking
the caller until there is room, would turn a slow disk into slow (and eventually timed-out) admission
responses for every pod create in the cluster; the webhook's job is to answer the API server, and the
`dropped` counter (exported as a metric) makes any loss visible instead of silent. See docs/audit.md.

Rotation is by size, done by the writer thread between two lines (a batch is split into one write per
file), so no line is ever split across files:
`audit.log` → `audit.log.1` → `audit.log.2` … up to `backups` files (`audit.log.N.gz` when `compress=True`).
One file belongs to one `AuditLog` (one process): give each server worker its own file, or use stdout.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import glob
import gzip
import logging
import os
import re
import select
import shutil
import threading
import time
from datetime import UTC, datetime
from pathlib import Path
from types import TracebackType
from typing import Any

import orjson

from policies.quantity import parse_bytes

log = logging.getLogger("gpu-admission.audit")

DEFAULT_MAX_BYTES = 50 * 1024 * 1024
ERROR_LOG_INTERVAL = 10.0  # seconds between two log lines about failed writes (each says how many failed)
DEFAULT_BACKUPS = 5
DEFAULT_QUEUE_SIZE = 10_000
DEFAULT_LINGER = 0.005  # seconds the woken writer waits for more records before writing a batch
MAX_WRITE = 1 << 20  # bytes of lines joined into one write to the file at the most
# Writes to stdout stay within PIPE_BUF, so that each is atomic in a pipe shared with other writers; a single
# line larger than that goes alone, as always.
STDOUT_WRITE = select.PIPE_BUF

# `.N` or `.N.gz` at the end of a rotated file's name: group 1 is N, group 2 the `.gz`.
ROTATED_SUFFIX = re.compile(r"\.(\d+)(\.gz)?$")


def format_time(ts: float) -> str:
    """An audit `time` value: RFC 3339 UTC with milliseconds, e.g. `2026-11-30T08:00:00.123Z`."""
    dt = datetime.fromtimestamp(ts, UTC)
    return f"{dt:%Y-%m-%dT%H:%M:%S}.{dt.microsecond // 1000:03d}Z"


def parse_time(value: str) -> datetime:
    """Parse an audit `time` value (any ISO 8601 form; no zone means UTC). Raises ValueError."""
    dt = datetime.fromisoformat(value)
    return dt.replace(tzinfo=UTC) if dt.tzinfo is None else dt.astimezone(UTC)


def is_stale(path: Path) -> bool:
    """A file left behind by a rotation interrupted by a kill, whose records exist elsewhere.

    `*.tmp` is a compressed copy being written; a rotated `audit.log.N` next to a complete `audit.log.N.gz`
    is the original of that copy (the `.gz` is renamed into place only once complete). Readers skip both.
    """
    if path.name.endswith(".tmp"):
        return True
    match = ROTATED_SUFFIX.search(path.name)
    return bool(match and not match.group(2) and path.with_name(path.name + ".gz").exists())


class AuditLog:
    """Non-blocking audit log writer with size-based rotation.

    `path`: the log file (opened now, so a bad path fails at start-up), or None for no file.
    `stdout`: also write every line to fd 1 (for `kubectl logs`).
    `max_bytes`: rotate before a line would take the file past this size (0 or less: never rotate).
    `backups`: how many rotated files to keep (0: the full file is deleted).
    `compress`: gzip rotated files to `audit.log.N.gz`.
    `queue_size`: records accepted but not yet written, beyond which `record()` drops (see module doc).
    `linger`: seconds the writer, woken by a record, waits for more before writing them as one batch: the
    bound on how long a record waits in the queue when the writer is idle (0: write at once).

    Counters (read any time, e.g. by /metrics): `written` records fully written to every destination,
    `dropped` records refused because the queue was full or the log closed, `rotations`, `errors`
    (failed writes, opens, rotations and unencodable records; the record involved is lost), and `reopens`.
    Every error is also logged, at most one line per ERROR_LOG_INTERVAL (with the count since the last).

    The file is reopened when its path no longer names the open file (checked before each batch: one
    stat): an external logrotate renamed it and created a new one, or someone removed it or its directory
    (the directory is recreated). Without that, records went on into the renamed or deleted file.
    """

    def __init__(
        self,
        path: str | os.PathLike[str] | None = None,
        *,
        stdout: bool = False,
        max_bytes: int = DEFAULT_MAX_BYTES,
        backups: int = DEFAULT_BACKUPS,
        compress: bool = False,
        queue_size: int = DEFAULT_QUEUE_SIZE,
        linger: float = DEFAULT_LINGER,
    ) -> None:
        if path is None and not stdout:
            raise ValueError("an audit log needs a file, stdout, or both")
        if backups < 0:
            raise ValueError(f"backups must be 0 or more, not {backups}")
        if queue_size < 1:
            raise ValueError(f"queue_size must be 1 or more, not {queue_size}")
        if not 0 <= linger <= 1:
            raise ValueError(f"linger must be between 0 and 1 second, not {linger}")
        self.path = Path(path) if path is not None else None
        self.max_bytes = max_bytes
        self.backups = backups
        self.compress = compress
        self.queue_size = queue_size
        self.linger = linger
        self._stdout_fd = 1 if stdout else None
        self._fd: int | None = None
        self._size = 0
        if self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._remove_stale()
            self._open()  # raises OSError: a log that cannot be opened is a start-up error

        self._lock = threading.Lock()
        self._has_work = threading.Condition(self._lock)  # the writer waits here
        self._progress = threading.Condition(self._lock)  # flush() waits here
        self._queue: collections.deque[dict[str, Any]] = collections.deque()
        self._accepted = 0  # records queued so far; guarded by _lock
        self._processed = 0  # records the writer has finished with (written or failed); guarded by _lock
        self._idle = False  # the writer waits for a first record; guarded by _lock
        self._hurry = 0  # flush() calls waiting: the writer skips its linger; guarded by _lock
        self._closing = False
        self._dropped = 0
        self._written = 0
        self._rotations = 0
        self._errors = 0
        self._reopens = 0
        self._errors_logged = 0  # errors already reported in a log line
        self._error_logged_at = 0.0
        self._thread = threading.Thread(target=self._run, name="audit-writer", daemon=True)
        self._thread.start()

    # -- request path ---------------------------------------------------------------------------------

    def record(self, rec: dict[str, Any]) -> bool:
        """Queue one decision record and return at once: True if queued, False if dropped (queue full or
        log closed). The log owns `rec` from now on: do not change it afterwards. A record without `time`
        gets the time it is written."""
        with self._lock:
            if self._closing or self._accepted - self._processed >= self.queue_size:
                self._dropped += 1
                return False
            self._queue.append(rec)
            self._accepted += 1
            if self._idle:  # the queue was empty and the writer asleep: wake it (once)
                self._idle = False
                self._has_work.notify()
        return True

    # -- control --------------------------------------------------------------------------------------

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until every record queued before this call has been written (or failed; see `errors`).
        True when done, False on timeout. After True, those records survive a kill of the process."""
        with self._lock:
            target = self._accepted
            self._hurry += 1
            self._has_work.notify()
            try:
                return self._progress.wait_for(lambda: self._processed >= target, timeout)
            finally:
                self._hurry -= 1

    def close(self, timeout: float | None = None) -> bool:
        """Stop accepting records, write everything queued, stop the writer and close the file.
        Call it on SIGTERM / server shutdown. True when everything was written in time. Idempotent."""
        with self._lock:
            self._closing = True
            self._has_work.notify()
        self._thread.join(timeout)
        if self._thread.is_alive():
            return False
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        return True

    def __enter__(self) -> AuditLog:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    # -- counters -------------------------------------------------------------------------------------

    @property
    def written(self) -> int:
        return self._written

    @property
    def dropped(self) -> int:
        return self._dropped

    @property
    def rotations(self) -> int:
        return self._rotations

    @property
    def errors(self) -> int:
        return self._errors

    @property
    def reopens(self) -> int:
        return self._reopens

    @property
    def pending(self) -> int:
        """Records queued and not yet written."""
        with self._lock:
            return self._accepted - self._processed

    def stats(self) -> dict[str, int]:
        """All counters at once, for metrics."""
        return {
            "written": self._written,
            "dropped": self._dropped,
            "rotations": self._rotations,
            "errors": self._errors,
            "reopens": self._reopens,
            "pending": self.pending,
        }

    # -- writer thread --------------------------------------------------------------------------------

    def _run(self) -> None:
        while True:
            with self._lock:
                while not self._queue and not self._closing:
                    self._idle = True
                    self._has_work.wait()
                self._idle = False
                if not self._queue:
                    return  # closing and drained
                if self.linger > 0 and not self._closing and not self._hurry:
                    # Let the records of the next few milliseconds join this one: one write for all of them.
                    self._has_work.wait_for(lambda: self._closing or self._hurry > 0, self.linger)
                batch, self._queue = self._queue, collections.deque()
            self._write_batch(batch)
            with self._lock:
                self._processed += len(batch)
                self._progress.notify_all()

    def _write_batch(self, batch: collections.deque[dict[str, Any]]) -> None:
        lines: list[bytes] = []
        for rec in batch:
            try:
                if "time" not in rec:
                    rec = {"time": format_time(time.time()), **rec}
                lines.append(orjson.dumps(rec, default=str, option=orjson.OPT_APPEND_NEWLINE))
            except (TypeError, ValueError) as exc:
                self._failed(1, "cannot encode an audit record", exc)
        ok = [True] * len(lines)  # written to every destination
        if self._stdout_fd is not None:
            i = 0
            while i < len(lines):
                i = self._write_lines(self._stdout_fd, lines, i, STDOUT_WRITE, ok)[0]
        if self.path is not None:
            self._write_file(lines, ok)
        self._written += sum(ok)

    def _write_file(self, lines: list[bytes], ok: list[bool]) -> None:
        self._follow_path()
        i = 0
        while i < len(lines):
            if self._fd is not None and 0 < self.max_bytes < self._size + len(lines[i]) and self._size > 0:
                self._rotate()
            if self._fd is None:
                try:
                    self._open()
                except OSError as exc:
                    self._failed(len(lines) - i, f"cannot open {self.path}", exc)
                    for k in range(i, len(lines)):
                        ok[k] = False
                    return
            assert self._fd is not None
            # Line i, then as many more as fit in this file before it must rotate (line i always goes: a line
            # larger than max_bytes gets a file of its own).
            room = self.max_bytes - self._size if self.max_bytes > 0 else MAX_WRITE
            i, done = self._write_lines(self._fd, lines, i, min(room, MAX_WRITE), ok)
            self._size += done

    def _write_lines(self, fd: int, lines: list[bytes], i: int, room: int, ok: list[bool]) -> tuple[int, int]:
        """Write line i and the lines after it that fit in `room` bytes with one write; returns (the index
        after the last line taken, bytes written). Lines not written in full are marked in `ok` and counted
        in `errors`."""
        j, size = i + 1, len(lines[i])
        while j < len(lines) and size + len(lines[j]) <= room:
            size += len(lines[j])
            j += 1
        data = memoryview(lines[i] if j == i + 1 else b"".join(lines[i:j]))
        # One write. A short write only happens on a full disk or a signal during a pipe write; then the rest
        # follows at once, still before any other line of this writer.
        done = 0
        try:
            while done < size:
                done += os.write(fd, data[done:])
        except OSError as exc:
            whole, end = i, 0  # the lines written in full before the failure
            while whole < j and end + len(lines[whole]) <= done:
                end += len(lines[whole])
                whole += 1
            for k in range(whole, j):
                ok[k] = False
            self._failed(
                j - whole, "audit write failed" + (f" to {self.path}" if fd != self._stdout_fd else " to stdout"), exc
            )
        return j, done

    def _failed(self, records: int, what: str, exc: BaseException) -> None:
        """Count lost records and log, at most once per ERROR_LOG_INTERVAL, how many were lost since."""
        self._errors += records
        now = time.monotonic()
        if now - self._error_logged_at < ERROR_LOG_INTERVAL and self._error_logged_at:
            return
        reason = f"{what}: {getattr(exc, 'strerror', None) or exc}"
        lost = self._errors - self._errors_logged
        log.error("audit records lost", extra={"reason": reason, "lost": lost, "errors_total": self._errors})
        self._errors_logged = self._errors
        self._error_logged_at = now

    def _follow_path(self) -> None:
        """Reopen when the path no longer names the open file (renamed by logrotate, removed, or its
        directory removed: recreated)."""
        assert self.path is not None
        if self._fd is None:
            return
        try:
            st = os.stat(self.path)
            fst = os.fstat(self._fd)
            if (st.st_ino, st.st_dev) == (fst.st_ino, fst.st_dev):
                return
            why = "replaced"
        except OSError:  # gone, or its directory is (ENOENT, ENOTDIR)
            why = "removed"
        os.close(self._fd)
        self._fd = None
        try:
            self._open()
        except OSError as exc:
            self._failed(0, f"cannot reopen {self.path}", exc)
            return
        self._reopens += 1
        log.warning("audit file was %s; reopened", why, extra={"path": str(self.path)})

    def _open(self) -> None:
        assert self.path is not None
        self.path.parent.mkdir(parents=True, exist_ok=True)  # its directory may have been removed since
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o640)
        self._fd = fd
        self._size = os.fstat(fd).st_size

    def _rotated(self) -> list[tuple[int, Path]]:
        """Existing rotated files of this log, (index, path), highest index first."""
        assert self.path is not None
        found = []
        for p in self.path.parent.glob(glob.escape(self.path.name) + ".*"):
            match = ROTATED_SUFFIX.fullmatch(p.name[len(self.path.name) :])
            if match:
                found.append((int(match.group(1)), p))
        return sorted(found, reverse=True)

    def _remove_stale(self) -> None:
        assert self.path is not None
        for p in self.path.parent.glob(glob.escape(self.path.name) + ".*"):
            if is_stale(p):
                with contextlib.suppress(OSError):
                    p.unlink()

    def _rotate(self) -> None:
        """Between two lines: close the full file, shift `.N` → `.N+1`, keep `backups`, start afresh."""
        assert self.path is not None and self._fd is not None
        os.close(self._fd)
        self._fd = None
        try:
            self._remove_stale()
            for index, p in self._rotated():
                if index >= self.backups:
                    p.unlink()
                else:
                    gz = ".gz" if p.name.endswith(".gz") else ""
                    p.replace(p.with_name(f"{self.path.name}.{index + 1}{gz}"))
            if self.backups == 0:
                self.path.unlink()
            else:
                first = self.path.with_name(self.path.name + ".1")
                self.path.replace(first)
                if self.compress:
                    self._gzip(first)
            self._rotations += 1
        except OSError as exc:
            self._failed(0, f"cannot rotate {self.path}", exc)
        with contextlib.suppress(OSError):
            self._open()  # on failure the next record retries (and reports)

    @staticmethod
    def _gzip(src: Path) -> None:
        dst = src.with_name(src.name + ".gz")
        tmp = src.with_name(dst.name + ".tmp")
        with src.open("rb") as fin, gzip.open(tmp, "wb") as fout:
            shutil.copyfileobj(fin, fout, 1 << 20)
        tmp.chmod(src.stat().st_mode & 0o777)
        tmp.replace(dst)  # the .gz appears only complete
        src.unlink()


# -- command-line options, for the server ----------------------------------------------------------------


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The `--audit-*` options of a command that writes the audit log (`serve`)."""
    group = parser.add_argument_group("audit log")
    group.add_argument("--audit-file", metavar="PATH", help="write the audit log to this file")
    group.add_argument("--audit-stdout", action="store_true", help="write the audit log to stdout")
    group.add_argument(
        "--audit-max-bytes",
        type=_size_arg,
        default=DEFAULT_MAX_BYTES,
        metavar="SIZE",
        help="rotate the file before it passes this size, a quantity such as 50Mi (default 50Mi; 0: never)",
    )
    group.add_argument(
        "--audit-backups",
        type=int,
        default=DEFAULT_BACKUPS,
        metavar="N",
        help="rotated files to keep (default 5)",
    )
    group.add_argument("--audit-compress", action="store_true", help="gzip rotated files")
    group.add_argument(
        "--audit-queue",
        type=int,
        default=DEFAULT_QUEUE_SIZE,
        metavar="N",
        help="records waiting to be written beyond which new ones are dropped (default 10000)",
    )


def from_args(args: argparse.Namespace) -> AuditLog | None:
    """The AuditLog the `--audit-*` options ask for, or None when neither file nor stdout is asked.
    Raises `webhook.cli.UsageError` (exit 2) for a bad value or a file that cannot be opened."""
    from webhook.cli import UsageError

    if not args.audit_file and not args.audit_stdout:
        return None
    try:
        return AuditLog(
            args.audit_file,
            stdout=args.audit_stdout,
            max_bytes=args.audit_max_bytes,
            backups=args.audit_backups,
            compress=args.audit_compress,
            queue_size=args.audit_queue,
        )
    except ValueError as exc:
        raise UsageError(f"audit log: {exc}") from None
    except OSError as exc:
        raise UsageError(f"cannot open audit log {args.audit_file}: {exc.strerror or exc}") from None


def _size_arg(text: str) -> int:
    """A Kubernetes quantity of bytes: `52428800`, `50Mi`, `1Gi` (`50M` is 50,000,000)."""
    try:
        return parse_bytes(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
