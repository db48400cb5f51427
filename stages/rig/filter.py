"""The One Euro filter (Casiez, Roussel & Vogel, "1 Euro Filter: A Simple Speed-based Low-pass
Filter for Noisy Input in Interactive Systems", CHI 2012), over whole arrays of coordinates.

Each element is low-passed by an exponential smoother whose cutoff rises with its speed:
fc = min_cutoff + beta * |dx|, dx being the raw derivative smoothed at d_cutoff, as the
authors' reference implementation (derivative from the previous raw value, alpha = 1 /
(1 + tau / dt), tau = 1 / (2 pi fc)). min_cutoff (Hz) sets the jitter at rest, beta (Hz of
cutoff per unit/s of speed, per m/s for metres) how fast the cutoff opens with speed,
d_cutoff (Hz) the derivative's smoothing. The paper's tuning: beta = 0, lower min_cutoff
until the jitter at rest is acceptable, then raise beta until the lag in motion is.

Latency: a first-order smoother lags a signal moving at steady speed v by exactly tau =
1 / (2 pi fc) seconds, fc = min_cutoff + beta * |v|. With the defaults (1 Hz, beta 1): 159
ms at rest, 80 ms at 1 m/s, 32 ms at 4 m/s. A NaN input (a keypoint not triangulated)
passes through as NaN and restarts that element.
"""

from __future__ import annotations

import math

import numpy as np

from pipeline.errors import NpucamError


class FilterError(NpucamError):
    """Samples the filter cannot take: a shape change or time not moving forward."""


def _alpha(cutoff: np.ndarray | float, dt: float) -> np.ndarray | float:
    return 1.0 / (1.0 + 1.0 / (2 * math.pi * cutoff * dt))


class OneEuroFilter:
    """Filters a stream of float arrays of one shape (e.g. [P, K, 3] metres), element-wise."""

    def __init__(self, min_cutoff: float = 1.0, beta: float = 1.0, d_cutoff: float = 1.0) -> None:
        if not (min_cutoff > 0 and beta >= 0 and d_cutoff > 0):
            raise FilterError(
                f"need min_cutoff > 0, beta >= 0, d_cutoff > 0; got {min_cutoff}, {beta}, "
                f"{d_cutoff}"
            )
        self.min_cutoff, self.beta, self.d_cutoff = min_cutoff, beta, d_cutoff
        self._t: float | None = None
        self._raw = self._out = self._dx = None

    def __call__(self, t: float, x: np.ndarray) -> np.ndarray:
        """t: seconds, increasing; x: float array -> float64 array of x's shape, filtered."""
        x = np.asarray(x, dtype=np.float64)
        if self._t is None:
            self._t, self._raw, self._out, self._dx = t, x.copy(), x.copy(), np.zeros_like(x)
            return x.copy()
        if x.shape != self._raw.shape:
            raise FilterError(f"sample shape {x.shape} differs from the stream's {self._raw.shape}")
        dt = t - self._t
        if not dt > 0:
            raise FilterError(f"time must increase: {t} after {self._t}")
        fresh = np.isnan(self._raw)  # restarted elements take the sample as is
        dx = np.where(fresh, 0.0, (x - self._raw) / dt)
        dx_hat = self._dx + _alpha(self.d_cutoff, dt) * (dx - self._dx)
        a = _alpha(self.min_cutoff + self.beta * np.abs(dx_hat), dt)
        out = np.where(fresh, x, self._out + a * (x - self._out))
        self._t, self._raw, self._out = t, x.copy(), out
        self._dx = np.where(np.isnan(x), 0.0, dx_hat)
        return out.copy()
