"""The one exception type of the `certs` package: a one-line, user-facing message (never key material)."""

from __future__ import annotations


class CertError(Exception):
    """A certificate operation failed; `str(exc)` is one line fit for the user."""
