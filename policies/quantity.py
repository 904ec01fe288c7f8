"""Kubernetes resource quantities (`10Gi`, `20G`, `1.5Gi`, `500m`, `1e3`) as exact numbers.

Why this exists: users write memory asks such as the `gpu-admission.io/gpu-memory` annotation in the
same notation as `resources.limits`, and a webhook that disagreed with the API server about what `10Gi`
means would mis-size GPU slices. So the grammar follows apimachinery's `resource.ParseQuantity`
(k8s.io/apimachinery/pkg/api/resource), and values are kept exact as `fractions.Fraction` so that
comparisons against slice sizes never suffer from float rounding.

Grammar accepted (the Kubernetes one)::

    quantity  = [sign] number [suffix]
    sign      = "+" | "-"
    number    = digits | digits "." [digits] | "." digits      (ASCII digits only)
    suffix    = binarySI | decimalSI | exponent
    binarySI  = "Ki" | "Mi" | "Gi" | "Ti" | "Pi" | "Ei"          (powers of 1024)
    decimalSI = "n" | "u" | "m" | "k" | "M" | "G" | "T" | "P" | "E"  (powers of 1000; "m" is milli)
    exponent  = ("e" | "E") [sign] digits                        (integer exponent, as Go's ParseInt)

Decisions, written down so callers can rely on them:
- No surrounding whitespace, no `K` (Kubernetes has only lower-case `k`), no `KB`/`MiB` spellings:
  the API server would reject those, so the webhook does too.
- A bare `E` is exa (10^18); `E3` after a number is an exponent. `1e` or `1e+` is an error.
- JSON numbers are accepted as well (an annotation value is always a string, but policy documents
  may hold plain numbers). `bool` is rejected even though Python treats it as an `int`; floats must be
  finite and are read through their shortest decimal form (`0.1` means one tenth, not the binary float).
- Limits that Kubernetes does not spell out but that protect the webhook: at most 100 characters and a
  decimal exponent within ±1000. Anything outside raises `QuantityError`, never another exception.
- Negative quantities parse (Kubernetes accepts them); `parse_bytes` rejects them because a negative
  size is never meaningful there.
"""

from __future__ import annotations

import math
import re
from fractions import Fraction

__all__ = ["QuantityError", "format_bytes", "parse_bytes", "parse_quantity"]

_MAX_LENGTH = 100
_MAX_EXPONENT = 1000

_NUMBER = re.compile(r"([+-]?)([0-9]+(?:\.[0-9]*)?|\.[0-9]+)(.*)", re.DOTALL)
_EXPONENT = re.compile(r"[eE]([+-]?[0-9]+)")

# Suffix → (base, power). From apimachinery's suffix tables (resource/suffix.go).
_SUFFIXES: dict[str, tuple[int, int]] = {
    "": (10, 0),
    "n": (10, -9),
    "u": (10, -6),
    "m": (10, -3),
    "k": (10, 3),
    "M": (10, 6),
    "G": (10, 9),
    "T": (10, 12),
    "P": (10, 15),
    "E": (10, 18),
    "Ki": (2, 10),
    "Mi": (2, 20),
    "Gi": (2, 30),
    "Ti": (2, 40),
    "Pi": (2, 50),
    "Ei": (2, 60),
}

_BINARY_UNITS: tuple[tuple[str, int], ...] = (
    ("Ei", 2**60),
    ("Pi", 2**50),
    ("Ti", 2**40),
    ("Gi", 2**30),
    ("Mi", 2**20),
    ("Ki", 2**10),
)


class QuantityError(ValueError):
    """A value that is not a Kubernetes quantity; the message is one line and names the value."""


def _shown(value: object) -> str:
    """The bad value as shown in an error: repr (newlines stay escaped), cut to keep one short line."""
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _error(value: object, why: str) -> QuantityError:
    return QuantityError(f"invalid quantity {_shown(value)}: {why}")


def parse_quantity(value: str | int | float) -> Fraction:
    """Parse a Kubernetes quantity (string, or a JSON int/float) into its exact value.

    Returns a `Fraction` so that `500m` is exactly 1/2 and `1.5Gi` exactly 1610612736.
    Raises `QuantityError` (a `ValueError`) for anything else, whatever the input.
    """
    if isinstance(value, bool):
        raise _error(value, "expected a quantity such as 10Gi, 20G or 500m, not a boolean")
    if isinstance(value, int):
        return Fraction(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise _error(value, "not a finite number")
        return Fraction(repr(value))
    if not isinstance(value, str):
        raise _error(value, f"expected a string or a number, not {type(value).__name__}")
    if len(value) > _MAX_LENGTH:
        raise _error(value, f"longer than {_MAX_LENGTH} characters")
    match = _NUMBER.fullmatch(value)
    if match is None:
        raise _error(value, "expected a number with an optional suffix, e.g. 10Gi, 20G, 1.5Gi or 500m")
    sign, number, suffix = match.groups()
    if suffix in _SUFFIXES:
        base, power = _SUFFIXES[suffix]
    else:
        exponent = _EXPONENT.fullmatch(suffix)
        if exponent is None:
            raise _error(value, f"unknown suffix {_shown(suffix)} (use Ki Mi Gi Ti Pi Ei, k M G T P E, m or e<N>)")
        base, power = 10, int(exponent.group(1))
    if abs(power) > _MAX_EXPONENT:  # 1e999999999 would otherwise build a gigantic integer
        raise _error(value, f"exponent out of range (limit ±{_MAX_EXPONENT})")
    whole, _, fraction = number.partition(".")
    magnitude = Fraction(int(whole or "0") * 10 ** len(fraction) + int(fraction or "0"), 10 ** len(fraction))
    result = magnitude * Fraction(base) ** power
    return -result if sign == "-" else result


def parse_bytes(value: str | int | float) -> int:
    """A quantity as a whole number of bytes, rounded up as Kubernetes' `Quantity.Value()` does.

    Rounding up keeps a memory ask honest: `1.1` bytes needs 2. Negative sizes raise `QuantityError`.
    """
    amount = parse_quantity(value)
    if amount < 0:
        raise _error(value, "a size must not be negative")
    return math.ceil(amount)


def format_bytes(n: int) -> str:
    """A byte count in binary units for messages: `10Gi`, `9.5Gi`, `512Mi`, `100`, `≈1.46Ki`.

    The largest unit that keeps the number ≥ 1 is used, with at most two decimals. A value that two
    decimals cannot show exactly is rounded and marked `≈`, so a message never shows `2Gi` for an ask of
    1.995Gi; unmarked results are valid quantities that parse back to `n`.
    """
    if isinstance(n, bool) or not isinstance(n, int):
        raise TypeError(f"format_bytes expects an int, not {type(n).__name__}")
    sign = "-" if n < 0 else ""
    size = abs(n)
    for index, (unit, scale) in enumerate(_BINARY_UNITS):
        if size >= scale:
            if size % scale == 0:
                return f"{sign}{size // scale}{unit}"
            shown = f"{size / scale:.2f}".rstrip("0").rstrip(".")
            if shown == "1024" and index > 0:  # ≈1023.999Mi reads better as ≈1Gi
                shown, unit = "1", _BINARY_UNITS[index - 1][0]
                scale = _BINARY_UNITS[index - 1][1]
            exact = Fraction(shown) * scale == size
            return f"{'' if exact else '≈'}{sign}{shown}{unit}"
    return f"{sign}{size}"
