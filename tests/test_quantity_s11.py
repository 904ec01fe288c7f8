"""policies/quantity.py in process, for its mutants (session 11, issue #20): every error read whole (the value
as shown, cut at 40 characters, and the reason), the length and exponent bounds on both sides, and
`format_bytes` where its branches meet: the type check, the ≈1024 carry into the next unit (and not past the
largest), and counts past a float's 53 bits. tests/test_quantity.py checks the grammar and values."""

from __future__ import annotations

from fractions import Fraction
from typing import Any

import pytest

from policies.quantity import QuantityError, format_bytes, parse_bytes, parse_quantity

HINT = "expected a number with an optional suffix, e.g. 10Gi, 20G, 1.5Gi or 500m"
SUFFIXES = "(use Ki Mi Gi Ti Pi Ei, k M G T P E, m or e<N>)"


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (True, "invalid quantity True: expected a quantity such as 10Gi, 20G or 500m, not a boolean"),
        (False, "invalid quantity False: expected a quantity such as 10Gi, 20G or 500m, not a boolean"),
        (float("inf"), "invalid quantity inf: not a finite number"),
        (float("nan"), "invalid quantity nan: not a finite number"),
        (None, "invalid quantity None: expected a string or a number, not NoneType"),
        ([1], "invalid quantity [1]: expected a string or a number, not list"),
        (b"1Gi", "invalid quantity b'1Gi': expected a string or a number, not bytes"),
        ("ten", f"invalid quantity 'ten': {HINT}"),
        ("", f"invalid quantity '': {HINT}"),
        ("1GB", f"invalid quantity '1GB': unknown suffix 'GB' {SUFFIXES}"),
        ("1e", f"invalid quantity '1e': unknown suffix 'e' {SUFFIXES}"),
        ("1e1001", "invalid quantity '1e1001': exponent out of range (limit ±1000)"),
        ("1e-1001", "invalid quantity '1e-1001': exponent out of range (limit ±1000)"),
        ("1" * 101, f"invalid quantity '{'1' * 36}...: longer than 100 characters"),
    ],
)
def test_each_error_whole(value: Any, message: str) -> None:
    with pytest.raises(QuantityError) as info:
        parse_quantity(value)
    assert str(info.value) == message


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("-1", "invalid quantity '-1': a size must not be negative"),
        (-5, "invalid quantity -5: a size must not be negative"),
        ("-1Gi", "invalid quantity '-1Gi': a size must not be negative"),
    ],
)
def test_a_negative_size_is_refused_whole(value: Any, message: str) -> None:
    with pytest.raises(QuantityError) as info:
        parse_bytes(value)
    assert str(info.value) == message
    assert parse_bytes("-0") == 0


def test_a_value_is_shown_whole_up_to_40_characters_and_cut_past() -> None:
    at = "1" + "x" * 37  # repr: 40 characters with its quotes
    with pytest.raises(QuantityError) as info:
        parse_quantity(at)
    assert str(info.value) == f"invalid quantity {at!r}: unknown suffix {('x' * 37)!r} {SUFFIXES}"
    past = "1" + "x" * 38  # repr: 41 characters
    with pytest.raises(QuantityError) as info:
        parse_quantity(past)
    shown = repr(past)[:37] + "..."
    assert str(info.value) == f"invalid quantity {shown}: unknown suffix {('x' * 38)!r} {SUFFIXES}"
    assert len(shown) == 40


def test_the_length_bound_is_100_characters() -> None:
    assert parse_quantity("1" * 100) == int("1" * 100)
    assert parse_quantity("0." + "5" * 98) == Fraction(int("5" * 98), 10**98)
    with pytest.raises(QuantityError, match="longer than 100 characters"):
        parse_quantity("1" * 101)


def test_the_exponent_bound_is_1000_both_ways() -> None:
    assert parse_quantity("1e1000") == 10**1000
    assert parse_quantity("1e-1000") == Fraction(1, 10**1000)
    assert parse_quantity("-2e+1000") == -2 * 10**1000
    for bad in ("1e1001", "1e-1001", "1e99999999"):
        with pytest.raises(QuantityError, match=r"exponent out of range \(limit ±1000\)"):
            parse_quantity(bad)


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (1.5, "format_bytes expects an int, not float"),
        (2.0, "format_bytes expects an int, not float"),
        ("1Gi", "format_bytes expects an int, not str"),
        (True, "format_bytes expects an int, not bool"),
        (None, "format_bytes expects an int, not NoneType"),
    ],
)
def test_format_bytes_takes_only_an_int(value: Any, message: str) -> None:
    with pytest.raises(TypeError) as info:
        format_bytes(value)
    assert str(info.value) == message


@pytest.mark.parametrize(
    ("n", "text"),
    [
        (1, "1"),
        (-1, "-1"),
        (1024, "1Ki"),
        (1025, "≈1Ki"),
        (-1536, "-1.5Ki"),
        (-1500, "≈-1.46Ki"),
        (2**50 - 1, "≈1Pi"),  # 1023.999…Ti carries into Pi
        (2**60 - 1, "≈1Ei"),  # 1023.999…Pi carries into Ei
        (2**70 - 1, "≈1024Ei"),  # Ei is the largest unit: no carry past it
        (2**70, "1024Ei"),
        (2**80, "1048576Ei"),
        ((2**53 + 1) * 2**60, f"{2**53 + 1}Ei"),  # exact, past a float's 53 bits
        (-((2**53 + 1) * 2**60), f"-{2**53 + 1}Ei"),
        (1023 * 2**30 + 2**29, "1023.5Gi"),
    ],
)
def test_format_bytes_where_its_branches_meet(n: int, text: str) -> None:
    assert format_bytes(n) == text
    if not text.startswith("≈"):
        assert parse_quantity(text) == n
