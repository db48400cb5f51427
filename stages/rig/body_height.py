"""A person's standing height from their 3D keypoints, in the keypoints' unit: the chain ankle ->
knee -> hip -> shoulder (each bone's median length over the frames, left and right averaged)
over its share of the height in Winter's anthropometric table (Biomechanics and Motor Control of
Human Movement, Fig. 4.1: ankle 0.039 H, knee 0.285 H, hip 0.530 H, shoulder 0.818 H).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from npu.models.sapiens2.keypoints import NAMES
from stages.rig.calibration import CalibrationError

CHAIN_SHARE = 0.818 - 0.039  # ankle to shoulder, as a fraction of standing height
_BONES = (("ankle", "knee"), ("knee", "hip"), ("hip", "shoulder"))
MIN_FRAMES = 5  # a bone measured on fewer frames gives no height


def body_height(points: np.ndarray, names: Sequence[str] = NAMES) -> float:
    """points float [N, K, 3] (NaN where not triangulated): one person's keypoints over N frames
    (or several people's, for one height of them all)."""
    index = {n: i for i, n in enumerate(names)}
    chain = 0.0
    for a, b in _BONES:
        sides = []
        for side in ("left", "right"):
            ia, ib = index.get(f"{side}_{a}"), index.get(f"{side}_{b}")
            if ia is None or ib is None:
                raise CalibrationError(
                    f"body height: the keypoints have no {side}_{a} / {side}_{b}"
                )
            length = np.linalg.norm(points[:, ia] - points[:, ib], axis=-1)
            length = length[np.isfinite(length)]
            if len(length) >= MIN_FRAMES:
                sides.append(float(np.median(length)))
        if not sides:
            raise CalibrationError(
                f"body height: the {a}-{b} bone was triangulated on fewer than {MIN_FRAMES} "
                "frames on either side; give the distance between two cameras instead"
            )
        chain += float(np.mean(sides))
    return chain / CHAIN_SHARE
