"""stages.pass_costs: the scheduler's learned pass costs move toward measured passes by
cost_alpha, bound and floor them as documented, and decay a blocked model's excess toward its
profile with the given half-life (exact arithmetic: the values are binary fractions)."""

from __future__ import annotations

import pytest

from stages.batches import ModelProfile, SchedulerError
from stages.pass_costs import PassCosts


def costs(alpha: float = 0.5, margin_devs: float = 2.0, half_life_s: float = 1.0) -> PassCosts:
    profile = ModelProfile("m", batch_size=1, max_wait_ms=0.0, contexts=("k",), cost_s=1.0)
    return PassCosts({"m": profile}, alpha, margin_devs, half_life_s)


def test_a_measured_pass_moves_the_estimate_and_deviation_by_alpha():
    c = costs()
    assert (c.estimate_s["m"], c.dev_s["m"]) == (1.0, 0.1)
    assert c.observe("m", 3.0) == 2.0  # 1 + 0.5 * (3 - 1)
    assert c.dev_s["m"] == pytest.approx(1.05)  # 0.1 + 0.5 * (|3 - 1| - 0.1)
    assert c.bound_s("m") == pytest.approx(2.0 + 2 * 1.05)
    assert c.floor_s("m") == 1.0  # the profile's cost: a pass that once took 1 s may again
    c.observe("m", 0.0)
    assert c.floor_s("m") == 1.0 and c.estimate_s["m"] == 1.0
    c.observe("m", 0.0)
    assert c.floor_s("m") == c.estimate_s["m"] == 0.5  # below the profile: the estimate


def test_a_blocked_model_loses_half_its_excess_each_half_life_and_no_more():
    c = costs()
    c.observe("m", 5.0)  # estimate 3.0, deviation 2.05
    c.relax(["m"], 1_000_000_000)  # one half-life
    assert c.estimate_s["m"] == pytest.approx(2.0)  # 1 + (3 - 1) / 2
    assert c.dev_s["m"] == pytest.approx(0.1 + (2.05 - 0.1) / 2)
    c.observe("m", 0.0)
    c.observe("m", 0.0)  # 2.0 -> 1.0 -> 0.5: below the profile, relaxing leaves it there
    c.relax(["m"], 1_000_000_000)
    assert c.estimate_s["m"] == 0.5


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        ({"alpha": 0.0}, r"cost_alpha must be in \(0, 1\], got 0.0"),
        ({"margin_devs": -1.0}, "margin_devs must be finite and >= 0, got -1.0"),
        ({"half_life_s": float("inf")}, "recovery_half_life_s must be finite and >= 0, got inf"),
    ],
)
def test_bad_settings_are_named_errors(kw, message):
    with pytest.raises(SchedulerError, match=message):
        costs(**kw)


def test_a_model_refused_before_any_pass_relaxes_toward_zero_and_its_first_pass_replaces_it():
    c = costs(half_life_s=1.0)
    c.refuse("m")  # its profile's cost (a warm-up figure) refused a job: nothing measured it
    c.relax(["m"], 1_000_000_000)
    assert (c.estimate_s["m"], c.dev_s["m"]) == (0.5, 0.05)  # halved toward 0, not to 1.0
    assert c.floor_s("m") == 0.5  # below the profile's: the job can now be tried
    assert c.observe("m", 0.25) == 0.25  # the first pass replaces the relaxed figure
    assert c.dev_s["m"] == pytest.approx(0.0125)  # a tenth of it, then halfway to |0.25 - 0.25|
    assert not c.refused
    c.refuse("m")  # measured now: judged on its passes, no longer relaxed toward zero
    assert not c.refused
    c.observe("m", 2.25)
    c.relax(["m"], 1_000_000_000)  # blocked: toward the profile's 1.0, as before
    assert c.estimate_s["m"] == 1.0 + (1.25 - 1.0) / 2
