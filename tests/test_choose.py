"""The one rule every auto keeps a candidate by (shimrt.choose), with real numbers."""

from __future__ import annotations

import math

import pytest

from shimrt import ShimrtError, UsageError, choose


def test_the_fastest_is_kept_and_the_first_of_equals():
    assert choose.fastest({"a": 3.0, "b": 1.0, "c": 1.0}) == "b"


def test_a_reference_stays_unless_beaten_by_more_than_the_margin():
    assert choose.fastest({"ddp": 10.0, "x": 9.95}, reference="ddp", margin=0.01) == "ddp"
    assert choose.fastest({"ddp": 10.0, "x": 9.8}, reference="ddp", margin=0.01) == "x"
    assert choose.fastest({"ddp": 10.0, "x": 9.95}, reference="ddp") == "x"  # no margin: any gain


def test_a_candidate_that_failed_is_never_kept_wherever_it_stands():
    """NaN compares false both ways: min() over it would depend on the order; it is left out."""
    assert choose.fastest({"a": math.nan, "b": 2.0, "c": 1.0}) == "c"
    assert choose.fastest({"b": 2.0, "a": math.nan}) == "b"
    assert choose.fastest({"ddp": math.nan, "x": 9.0}, reference="ddp", margin=0.01) == "x"
    assert choose.fastest({"ddp": math.inf, "x": 9.0}, reference="ddp", margin=0.01) == "x"
    with pytest.raises(ShimrtError, match="measured no candidate"):
        choose.fastest({"a": math.nan, "b": math.inf})


def test_nothing_measured_is_said_not_chosen():
    with pytest.raises(ShimrtError, match="no candidate to choose from"):
        choose.fastest({})
    with pytest.raises(ShimrtError, match="measured no candidate"):
        choose.fastest({"a": math.inf, "b": math.inf})
    with pytest.raises(UsageError, match="reference must be one of the candidates"):
        choose.fastest({"a": 1.0}, reference="z")
    with pytest.raises(UsageError, match="margin must be a finite number in 0..0.5"):
        choose.fastest({"a": 1.0}, margin=2)


def test_pick_measures_each_candidate_once_in_order():
    seen = []

    def measure(c):
        seen.append(c)
        return {"a": 2.0, "b": 1.5, "c": math.inf}[c]
    best, times = choose.pick(["a", "b", "c"], measure)
    assert best == "b" and seen == ["a", "b", "c"] and list(times) == ["a", "b", "c"]


def test_the_standard_error_is_the_spread_of_the_mean_and_zero_with_fewer_than_two():
    assert choose.standard_error([10.0, 12.0, 14.0, 16.0]) == pytest.approx(1.2910, rel=1e-4)  # stdev 2.582 / 2
    assert choose.standard_error([10.0]) == 0.0 and choose.standard_error([]) == 0.0
