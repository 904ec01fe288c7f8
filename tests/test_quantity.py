"""Kubernetes quantity parsing: the apimachinery grammar, exact values, one-line errors."""

from __future__ import annotations

from fractions import Fraction

import pytest
from hypothesis import given
from hypothesis import strategies as st

from policies.quantity import QuantityError, format_bytes, parse_bytes, parse_quantity

GI = 2**30

VALID = [
    # plain integers and decimals
    ("0", 0),
    ("1", 1),
    ("007", 7),
    ("1.5", Fraction(3, 2)),
    ("1.", 1),
    (".5", Fraction(1, 2)),
    ("0.1", Fraction(1, 10)),
    # signs
    ("+1", 1),
    ("-1", -1),
    ("-.5", Fraction(-1, 2)),
    ("+0", 0),
    # binary SI
    ("1Ki", 1024),
    ("1Mi", 2**20),
    ("10Gi", 10 * GI),
    ("1.5Gi", 3 * 2**29),
    ("1Ti", 2**40),
    ("1Pi", 2**50),
    ("1Ei", 2**60),
    ("0.5Ki", 512),
    # decimal SI, including milli and the rarer nano/micro apimachinery also accepts
    ("1k", 1000),
    ("20G", 20 * 10**9),
    ("1M", 10**6),
    ("1T", 10**12),
    ("1P", 10**15),
    ("1E", 10**18),
    ("500m", Fraction(1, 2)),
    ("1m", Fraction(1, 1000)),
    ("1u", Fraction(1, 10**6)),
    ("1n", Fraction(1, 10**9)),
    ("2.5k", 2500),
    # decimal exponent
    ("1e3", 1000),
    ("1E3", 1000),
    ("1e+3", 1000),
    ("1e-3", Fraction(1, 1000)),
    ("1.5e3", 1500),
    ("12e0", 12),
    ("-1e2", -100),
]

INVALID = [
    "",
    " ",
    ".",
    "+",
    "-",
    "ten",
    "Gi",
    "1K",  # Kubernetes has lower-case k only
    "1KB",
    "1MiB",
    "1gi",
    "1 Gi",
    " 1Gi",
    "1Gi ",
    "1Gi\n",
    "1e",
    "1e+",
    "1e1.5",
    "1Ki3",
    "1e3Gi",
    "1.5.5",
    "--1",
    "+-1",
    "1,5",
    "٣",  # a non-ASCII digit
    "0x10",
    "1_000",
    "inf",
    "NaN",
    "1e1001",
    "1" * 101,
]


@pytest.mark.parametrize(("text", "expected"), VALID)
def test_valid(text: str, expected: int | Fraction) -> None:
    value = parse_quantity(text)
    assert isinstance(value, Fraction)
    assert value == expected


@pytest.mark.parametrize("text", INVALID)
def test_invalid_is_one_line_naming_the_value(text: str) -> None:
    with pytest.raises(QuantityError) as info:
        parse_quantity(text)
    message = str(info.value)
    assert "\n" not in message
    assert repr(text)[:30] in message


def test_quantity_error_is_a_value_error() -> None:
    assert issubclass(QuantityError, ValueError)


@pytest.mark.parametrize(
    ("value", "expected"),
    [(5, 5), (0, 0), (-3, -3), (1.5, Fraction(3, 2)), (0.1, Fraction(1, 10)), (1e3, 1000), (1e16, 10**16)],
)
def test_json_numbers(value: int | float, expected: Fraction) -> None:
    assert parse_quantity(value) == expected


@pytest.mark.parametrize("value", [True, False, None, float("nan"), float("inf"), [], {}, b"1Gi"])
def test_non_quantities_raise_quantity_error(value: object) -> None:
    with pytest.raises(QuantityError):
        parse_quantity(value)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("10Gi", 10 * GI),
        ("1m", 1),  # rounded up, as Quantity.Value() does
        ("1.1", 2),
        ("0", 0),
        ("20G", 20_000_000_000),
        ("1.5Gi", 1610612736),
        (1024, 1024),
        (2.5, 3),
    ],
)
def test_parse_bytes(value: str | int | float, expected: int) -> None:
    assert parse_bytes(value) == expected


@pytest.mark.parametrize("value", ["-1", "-1Gi", -1, "ten"])
def test_parse_bytes_rejects(value: str | int) -> None:
    with pytest.raises(QuantityError):
        parse_bytes(value)


@pytest.mark.parametrize(
    ("n", "text"),
    [
        (10 * GI, "10Gi"),
        (int(9.5 * GI), "9.5Gi"),
        (512 * 2**20, "512Mi"),
        (1536, "1.5Ki"),
        (1500, "≈1.46Ki"),
        (2_142_114_939, "≈2Gi"),  # 1.995Gi: never shown as a plain 2Gi
        (1023, "1023"),
        (0, "0"),
        (GI - 1, "≈1Gi"),  # 1023.999Mi reads as ≈1Gi
        (int(1.25 * 2**20), "1.25Mi"),
        (2**60, "1Ei"),
        (-2 * GI, "-2Gi"),
    ],
)
def test_format_bytes(n: int, text: str) -> None:
    assert format_bytes(n) == text


@given(st.integers(min_value=0, max_value=2**62))
def test_format_bytes_is_exact_unless_marked(n: int) -> None:
    text = format_bytes(n)
    if text.startswith("≈"):
        assert abs(parse_quantity(text[1:]) - n) <= Fraction(n, 200)  # two decimals of a unit ≥ 1
    else:
        assert parse_bytes(text) == n


@given(st.text(max_size=60))
def test_arbitrary_text_only_raises_quantity_error(text: str) -> None:
    try:
        value = parse_quantity(text)
    except QuantityError as exc:
        assert "\n" not in str(exc)
    else:
        assert isinstance(value, Fraction)


@given(st.from_regex(r"[+-]?[0-9.eEkKMGTPEimnu]{0,12}", fullmatch=True))
def test_quantity_like_text_only_raises_quantity_error(text: str) -> None:
    try:
        value = parse_quantity(text)
    except QuantityError:
        return
    assert isinstance(value, Fraction)


@given(
    st.integers(min_value=-(10**12), max_value=10**12),
    st.sampled_from([("", 1), ("k", 10**3), ("M", 10**6), ("G", 10**9), ("Ki", 2**10), ("Gi", 2**30)]),
)
def test_integer_with_suffix(n: int, suffix: tuple[str, int]) -> None:
    unit, scale = suffix
    assert parse_quantity(f"{n}{unit}") == n * scale


@given(st.integers(min_value=0, max_value=10**6), st.integers(min_value=0, max_value=999))
def test_decimal_with_exponent(whole: int, millis: int) -> None:
    assert parse_quantity(f"{whole}.{millis:03d}e3") == whole * 1000 + millis
