"""Threads in tests whose failures fail the test.

An exception in a plain `threading.Thread` only reaches `threading.excepthook`: pytest reports it as a
warning (pyproject.toml turns that warning into an error suite-wide, as a net). `Worker` is the explicit
form: `join()` re-raises the thread's exception in the test, and fails when the thread is still running.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any


class Worker(threading.Thread):
    def __init__(self, target: Callable[..., Any], *args: Any) -> None:
        super().__init__(target=self._capture, args=(target, *args), daemon=True)
        self.error: BaseException | None = None

    def _capture(self, target: Callable[..., Any], *args: Any) -> None:
        try:
            target(*args)
        except BaseException as exc:  # re-raised by join() in the test's own thread
            self.error = exc

    def join(self, timeout: float | None = 30.0) -> None:
        super().join(timeout)
        if self.is_alive():
            raise AssertionError(f"thread {self.name} still running after {timeout} s")
        if self.error is not None:
            raise self.error
