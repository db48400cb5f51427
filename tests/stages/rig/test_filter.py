"""The One Euro filter (stages/rig/filter.py) against the authors' scalar algorithm, retyped
from Casiez's reference Python implementation (OneEuroFilter with LowPassFilter: the
derivative from the previous raw value, alpha = 1 / (1 + tau / te)), and its stated latency.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from stages.rig.filter import FilterError, OneEuroFilter


class ReferenceOneEuro:
    """One scalar stream, as the reference implementation filters it."""

    def __init__(self, mincutoff: float, beta: float, dcutoff: float) -> None:
        self.mincutoff, self.beta, self.dcutoff = mincutoff, beta, dcutoff
        self.x_raw = self.x_hat = self.dx_hat = self.t = None

    @staticmethod
    def alpha(cutoff: float, te: float) -> float:
        tau = 1.0 / (2 * math.pi * cutoff)
        return 1.0 / (1.0 + tau / te)

    def __call__(self, x: float, t: float) -> float:
        if self.t is None:
            self.x_raw, self.x_hat, self.dx_hat, self.t = x, x, 0.0, t
            return x
        te = t - self.t
        dx = (x - self.x_raw) / te
        a_d = self.alpha(self.dcutoff, te)
        self.dx_hat = a_d * dx + (1 - a_d) * self.dx_hat
        a = self.alpha(self.mincutoff + self.beta * abs(self.dx_hat), te)
        self.x_hat = a * x + (1 - a) * self.x_hat
        self.x_raw, self.t = x, t
        return self.x_hat


def test_matches_the_reference_element_by_element():
    rng = np.random.default_rng(0)
    times = np.cumsum(rng.uniform(0.025, 0.045, 120))  # jittered ~30 fps
    signal = np.sin(times[:, None, None] * rng.uniform(0.5, 3, (1, 4, 3))) + rng.normal(
        0, 0.01, (120, 4, 3)
    )
    ours = OneEuroFilter(min_cutoff=1.2, beta=0.8, d_cutoff=1.5)
    refs = [ReferenceOneEuro(1.2, 0.8, 1.5) for _ in range(12)]
    for t, x in zip(times, signal, strict=True):
        out = ours(t, x)
        expect = [r(v, t) for r, v in zip(refs, x.ravel(), strict=True)]
        assert np.allclose(out.ravel(), expect, rtol=0, atol=1e-12)


@pytest.mark.parametrize(("speed", "beta"), [(0.5, 0.0), (1.0, 1.0), (4.0, 1.0)])
def test_lag_on_a_ramp_is_the_stated_tau(speed, beta):
    """Steady state on x = v t: the output trails by v * tau, tau = 1 / (2 pi fc) with
    fc = min_cutoff + beta * v, the latency the module docstring states."""
    f = OneEuroFilter(min_cutoff=1.0, beta=beta, d_cutoff=1.0)
    dt = 1 / 30
    for i in range(600):
        out = f(i * dt, np.array([speed * i * dt]))
    tau = 1 / (2 * math.pi * (1.0 + beta * speed))
    assert out[0] == pytest.approx(speed * 599 * dt - speed * tau, abs=1e-9)


def test_nan_passes_through_and_restarts_the_element():
    f = OneEuroFilter()
    f(0.0, np.array([1.0, 1.0]))
    assert np.isnan(f(0.1, np.array([np.nan, 2.0]))[0])
    out = f(0.2, np.array([5.0, 2.0]))
    assert out[0] == 5.0 and 1.0 < out[1] < 2.0


def test_bad_samples_are_refused():
    f = OneEuroFilter()
    f(1.0, np.zeros((2, 3)))
    with pytest.raises(FilterError, match="time must increase"):
        f(1.0, np.zeros((2, 3)))
    with pytest.raises(FilterError, match=r"sample shape \(3, 3\) differs"):
        f(2.0, np.zeros((3, 3)))
    with pytest.raises(FilterError, match="min_cutoff > 0"):
        OneEuroFilter(min_cutoff=0)
