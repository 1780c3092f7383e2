"""The broker's request-latency histogram read as the benchmark reads it: the observations
between two scrapes and the bucket that holds a quantile (no broker, no timing)."""

from __future__ import annotations

import math

from bench import histogram

BEFORE = {0.0005: 10.0, 0.001: 10.0, 0.0025: 10.0, math.inf: 10.0}
AFTER = {0.0005: 900.0, 0.001: 1005.0, 0.0025: 1009.0, math.inf: 1010.0}


def test_only_the_observations_between_the_scrapes_count() -> None:
    spent = histogram.between(BEFORE, AFTER)
    assert histogram.count(spent) == 1000.0
    assert spent[0.0005] == 890.0


def test_the_quantile_is_the_bound_of_the_bucket_that_holds_it() -> None:
    spent = histogram.between(BEFORE, AFTER)
    assert histogram.quantile_bound(spent, 0.5) == 0.0005
    assert histogram.quantile_bound(spent, 0.99) == 0.001   # 995 of 1000 within 1 ms
    assert histogram.quantile_bound(spent, 0.999) == 0.0025
    assert histogram.quantile_bound(spent, 1.0) == math.inf  # one beyond the last bound
    assert histogram.share_at_most(spent, 0.001) == 0.995


def test_without_observations_there_is_no_quantile() -> None:
    assert histogram.quantile_bound(histogram.between(AFTER, AFTER), 0.99) is None
    assert histogram.share_at_most({}, 0.001) is None
