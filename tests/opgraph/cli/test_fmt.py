"""``opgraph.fmt``: the one home of number formatting; its doctests are its examples."""

from __future__ import annotations

import doctest

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import opgraph.fmt
from opgraph.fmt import fmt_bytes, fmt_count, fmt_us, fmt_us_sig, fmt_x


def test_doctests() -> None:
    result = doctest.testmod(opgraph.fmt)
    assert result.attempted > 0 and result.failed == 0


def test_durations_pick_the_unit_that_reads_best() -> None:
    assert [opgraph.fmt.fmt_us(v) for v in (999.994, 1000.0, 999_999.0, 1e6)] == [
        "999.99 us",
        "1.000 ms",
        "999.999 ms",
        "1.000 s",
    ]
    assert opgraph.fmt.fmt_us_sig(-1500.0) == "-1.5 ms"
    assert opgraph.fmt.fmt_count(2.5e21, "FLOP") == "2500 EFLOP"


def test_values_that_round_to_a_units_limit_move_to_the_next_unit() -> None:
    assert fmt_bytes(1030284) == "1006 KiB"  # four integer digits, not 1.01e+03 KiB
    assert fmt_bytes(1024**2 - 1) == "1 MiB"
    assert fmt_bytes(1000) == "1000 B"
    assert (fmt_bytes(1024), fmt_bytes(1025), fmt_bytes(2**40)) == ("1 KiB", "1 KiB", "1 TiB")  # not 1020 B
    assert fmt_count(999.6, "FLOP") == "1 kFLOP"
    assert fmt_count(999_600_000, "B") == "1 GB"
    assert fmt_us(999.996) == "1.000 ms"
    assert fmt_us(999_999.6) == "1.000 s"
    assert fmt_us_sig(999.96) == "1 ms"
    assert fmt_x(12345) == "12300x"
    assert fmt_count(1e-5) == "0.00001"


_COUNT_UNITS = ("", "k", "M", "G", "T", "P", "E")
_BYTE_UNITS = ("B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB")


def _significant(number: str) -> int:
    digits = number.lstrip("-").replace(".", "").lstrip("0")
    return len(digits.rstrip("0")) if "." not in number else len(digits)


def _check(text: str, value: float, units: tuple[str, ...], step: int, suffix: str = "") -> None:
    number, _, unit = text.partition(" ")
    unit = unit.removesuffix(suffix) if suffix else unit
    assert "e" not in number.lower() and "inf" not in number, text
    assert _significant(number) <= 4, text
    assert unit in units, text
    i = units.index(unit)
    shown = float(number)
    assert abs(shown) < step or i == len(units) - 1, f"{text}: should read in the next unit"
    assert abs(shown) >= 1 or i == 0, f"{text}: should read in the unit below"
    assert abs(value) < float(step) ** (i + 1) or i == len(units) - 1, f"{text}: {value} is past the unit"
    # the number is the value in that unit, rounded
    assert shown * step**i == pytest.approx(value, rel=6e-3, abs=1e-12), text


@settings(max_examples=400, deadline=None)
@given(st.floats(min_value=0, max_value=999e18, allow_nan=False) | st.integers(0, 10**20).map(float))
def test_fmt_count_reads_in_the_right_prefix(value: float) -> None:
    _check(fmt_count(value, "FLOP"), value, _COUNT_UNITS, 1000, "FLOP")
    _check(fmt_count(-value), -value, _COUNT_UNITS, 1000)


@settings(max_examples=400, deadline=None)
@given(st.floats(min_value=0, max_value=1000 * 1024.0**6, allow_nan=False) | st.integers(0, 2**62).map(float))
def test_fmt_bytes_reads_in_the_right_unit(value: float) -> None:
    _check(fmt_bytes(value), value, _BYTE_UNITS, 1024)


@settings(max_examples=400, deadline=None)
@given(st.floats(min_value=1e-3, max_value=9.99e8, allow_nan=False))
def test_fmt_us_sig_reads_in_the_right_unit(value: float) -> None:
    _check(fmt_us_sig(value), value, ("us", "ms", "s"), 1000)


@settings(max_examples=400, deadline=None)
@given(st.floats(min_value=0, max_value=1e9, allow_nan=False))
def test_fmt_us_picks_the_unit_after_rounding(value: float) -> None:
    number, unit = fmt_us(value).split(" ")
    assert "e" not in number
    shown = float(number)
    assert shown < 1000 or unit == "s"
    assert shown >= 1 or unit == "us"
