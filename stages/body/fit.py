"""Fits the ANNY body to one person's 3D keypoints: the phenotype once over a window of
frames, then held; the pose every frame, warm-started from the last, by Levenberg-Marquardt
with an analytic Jacobian (subtree sums of the per-bone keypoint terms), a Cauchy robust
loss on each keypoint's distance, per-keypoint confidence weights, a weak pull towards the
last frame's pose, rotations re-orthonormalised and clamped to the joint limits every step.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from pipeline.errors import NpucamError
from stages.body.chain import UnitChain
from stages.body.keypoint_map import BodyKeypoints
from stages.body.limits import JointLimits
from stages.body.model import AnnyModel, RestBody, special_procrustes
from stages.body.rotations import matrix_to_rotvec, rotvec_to_matrix

# the bones the fit moves (both sides for .L/.R), besides the root; the others keep the rest
# pose relative to their parent
BODY_BONES = (
    "spine03", "head",
    "upperarm01.L", "lowerarm01.L", "wrist.L",
    "upperarm01.R", "lowerarm01.R", "wrist.R",
    "upperleg01.L", "lowerleg01.L", "foot.L",
    "upperleg01.R", "lowerleg01.R", "foot.R",
)  # fmt: skip
# with FitConfig.fingers, also each finger's first two bones, fitted once the phenotype is
# held (BodyTracker); the third (fingerN-3) only moves the tip, which has no mapped keypoint
FINGER_BONES = tuple(f"finger{n}-{k}.{side}" for side in "LR" for n in range(1, 6) for k in (1, 2))
FITTED_BONES = BODY_BONES
TORSO = ("left_shoulder", "right_shoulder", "left_hip", "right_hip")
# pose-independent distances (within one bone or across the torso) that start the phenotype
SEGMENTS = tuple(
    (f"{side}_{a}", f"{side}_{b}")
    for side in ("left", "right")
    for a, b in (
        ("shoulder", "elbow"),
        ("elbow", "wrist"),
        ("hip", "knee"),
        ("knee", "ankle"),
        ("ankle", "heel"),
        ("heel", "big_toe"),
        ("shoulder", "hip"),
        ("wrist", "forefinger_third_joint"),
        ("wrist", "pinky_finger_third_joint"),
    )
) + (
    ("left_shoulder", "right_shoulder"),
    ("left_hip", "right_hip"),
    ("left_ear", "right_ear"),
    ("left_eye", "right_eye"),
)


# the chained units' world poses [units, 3, 4] and full-rig parents' rotations [units, 3, 3]
UnitPoses = tuple[np.ndarray, np.ndarray]


class BodyFitError(NpucamError):
    """Inputs the body fit cannot use; says which and why."""


@dataclass(frozen=True)
class FitConfig:
    """robust_scale: the Cauchy loss's scale (m): a keypoint that far off counts half.
    pose_prior: weight (m per rad) of the pull towards the last frame's pose. iterations:
    LM steps a frame (first_iterations for a person's first frame). window: frames over
    which the phenotype is fitted; phenotype_rounds: alternations of pose and phenotype fits
    there. min_points: fewer mapped keypoints with a target and the frame is not fitted.
    fingers: also map the finger joints and turn the finger bones (FINGER_BONES), from the
    frame the phenotype is held."""

    robust_scale: float = 0.04
    pose_prior: float = 0.002
    iterations: int = 6
    first_iterations: int = 40
    window: int = 30
    phenotype_rounds: int = 6
    phenotype_prior: float = 0.005
    min_points: int = 8
    min_confidence: float = 0.3
    tolerance: float = 1e-7
    fingers: bool = False


@dataclass
class Pose:
    """rotations float64 [B, 3, 3] (local-ref deltas), translation [3] (the root's world
    position, m)."""

    rotations: np.ndarray
    translation: np.ndarray

    def copy(self) -> Pose:
        return Pose(self.rotations.copy(), self.translation.copy())


@dataclass(frozen=True)
class BodyFrame:
    """One fitted frame: the pose, the phenotype [6] and whether it is final (window done),
    the fitted mapped points [N, 3] (m), the residual per point [N] (m, NaN without a
    target) and the LM iterations run."""

    pose: Pose
    phenotype: np.ndarray
    phenotype_final: bool
    keypoints: np.ndarray
    residuals: np.ndarray
    iterations: int


class PoseSolver:
    """Levenberg-Marquardt on one frame for a fixed rest body, turning the root and `fitted`
    (bone names). units: the bones chained (stages/body/chain.py), by default the root and
    the fitted bones (the others folded onto them); bench/body_fit.py passes every bone for
    its unfolded reference."""

    def __init__(
        self,
        model: AnnyModel,
        points: BodyKeypoints,
        config: FitConfig,
        units: np.ndarray | None = None,
        fitted: tuple[str, ...] = FITTED_BONES,
    ) -> None:
        self.model = model
        self.points = points
        self.config = config
        self.bones = np.array(sorted([0] + [model.bone(b) for b in fitted]))
        self.units = self.bones if units is None else np.asarray(units)
        self.fit_rows = np.searchsorted(self.units, self.bones)
        if not np.array_equal(self.units[self.fit_rows], self.bones):
            raise BodyFitError("the chained units must include the root and every fitted bone")
        self.limits = JointLimits(model.bone_labels, self.bones, model.reference)
        self.parent_reference_t = model.reference[model.parent_or_self[self.bones]].transpose(
            0, 2, 1
        )
        self.parent_reference_t[0] = model.reference[0].T
        axes = self.limits.free_axes()
        self.step_map = np.zeros((3 + 3 * len(self.bones), 3 + axes.shape[1]))
        self.step_map[:3, :3] = np.eye(3)
        self.step_map[3:, 3:] = axes
        self.rest: RestBody | None = None

    def set_rest(self, rest: RestBody) -> None:
        self.rest = rest
        self.chain = UnitChain(self.model, rest, self.units, self.points.anchors(rest))
        self.subtree = self.chain.subtree[self.fit_rows]
        self.weight_share = self.chain.weight_share[:, self.fit_rows]

    def keypoints(self, pose: Pose) -> tuple[np.ndarray, np.ndarray, UnitPoses]:
        """Mapped points [N, 3], their per-unit terms [N, units, 3], and the units' world
        poses and parent rotations (for the Jacobian)."""
        transforms, poses, parent_rot = self.chain.forward(
            pose.rotations[self.units], pose.translation
        )
        points, terms = self.chain.keypoints(transforms)
        return points, terms, (poses, parent_rot)

    def jacobian(self, terms: np.ndarray, posed: UnitPoses) -> np.ndarray:
        """[N, 3, 3 + 3 nd]: d point / d (root translation, each fitted bone's rotation
        increment), the increment being E in D <- E D (local-ref axes): a turn of bone b by
        w (world) about its posed head moves point n by w x (S[n, b] - s[n, b] head_b), S
        the sum of its terms over b's subtree and s their weight."""
        poses, parent_rot = posed
        sums = self.subtree @ terms
        pivot = poses[self.fit_rows, :, 3]
        v = sums - self.weight_share[..., None] * pivot[None]
        axes = parent_rot[self.fit_rows] @ self.parent_reference_t
        # d/d delta of (w x v) = -[v]x A: column k is -(v x A[:, k])
        cols = _cross(axes.transpose(0, 2, 1)[None], v[:, :, None, :])
        n, nd = v.shape[:2]
        jac = np.empty((n, 3, 3 + 3 * nd))
        jac[:, :, :3] = np.eye(3)
        jac[:, :, 3:] = cols.transpose(0, 3, 1, 2).reshape(n, 3, 3 * nd)
        return jac

    def initial_pose(self, targets: np.ndarray, valid: np.ndarray) -> Pose:
        """The rest pose turned and moved onto the torso keypoints (Kabsch), or the centroid."""
        pose = Pose(np.tile(np.eye(3), (self.model.bone_count, 1, 1)), np.zeros(3))
        rest_points, _, _ = self.keypoints(pose)
        torso = [self.points.names.index(n) for n in TORSO]
        use = [i for i in torso if valid[i]]
        if len(use) >= 3:
            p, q = rest_points[use], targets[use]
            pc, qc = p.mean(axis=0), q.mean(axis=0)
            u, _, vt = np.linalg.svd((q - qc).T @ (p - pc))
            d = np.sign(np.linalg.det(u @ vt))
            turn = u @ np.diag([1.0, 1.0, d]) @ vt
        else:
            turn, pc, qc = np.eye(3), rest_points[valid].mean(0), targets[valid].mean(0)
        u0 = self.model.reference[0]
        pose.rotations[0] = u0 @ turn @ u0.T
        pose.translation = qc - turn @ pc
        return pose

    def _cost(
        self, pose: Pose, prior: Pose, targets: np.ndarray, conf: np.ndarray
    ) -> tuple[float, np.ndarray, np.ndarray, UnitPoses, np.ndarray]:
        points, terms, poses = self.keypoints(pose)
        r = np.where(conf[:, None] > 0, points - targets, 0.0)
        d2 = (r**2).sum(axis=1)
        c2 = self.config.robust_scale**2
        data = float((conf * c2 * np.log1p(d2 / c2)).sum())
        phi = self._prior_residual(pose, prior)
        cost = data + self.config.pose_prior**2 * float((phi**2).sum())
        return cost, r, terms, poses, phi

    def _prior_residual(self, pose: Pose, prior: Pose) -> np.ndarray:
        rel = pose.rotations[self.bones] @ prior.rotations[self.bones].transpose(0, 2, 1)
        return matrix_to_rotvec(rel)

    def solve(
        self, pose: Pose, prior: Pose, targets: np.ndarray, conf: np.ndarray, iterations: int
    ) -> tuple[Pose, int]:
        """LM from `pose`; prior: the pose the weak prior pulls towards. targets [N, 3] (NaN:
        missing), conf [N] (0: unused)."""
        cfg = self.config
        targets = np.nan_to_num(targets)  # missing ones weigh 0
        cost, r, terms, poses, phi = self._cost(pose, prior, targets, conf)
        damping = 1e-3
        steps = 0
        for _ in range(iterations):
            steps += 1
            jac = self.jacobian(terms, poses).reshape(3 * len(r), -1) @ self.step_map
            d2 = (r**2).sum(axis=1)
            w = np.repeat(conf / (1.0 + d2 / cfg.robust_scale**2), 3)
            h = jac.T @ (w[:, None] * jac)
            g = jac.T @ (w * r.ravel())
            axes = self.step_map[3:, 3:]
            h[3:, 3:] += cfg.pose_prior**2 * (axes.T @ axes)
            g[3:] += cfg.pose_prior**2 * (axes.T @ phi.ravel())
            while True:
                free = -np.linalg.solve(h + damping * np.diag(np.diag(h) + 1e-9), g)
                step = self.step_map @ free
                trial = self._apply(pose, step)
                trial_cost, tr, tterms, tposes, tphi = self._cost(trial, prior, targets, conf)
                if trial_cost <= cost:
                    damping = max(damping / 10.0, 1e-7)
                    break
                damping *= 10.0
                if damping > 1e6:
                    return pose, steps
            improvement = cost - trial_cost
            pose, cost, r, terms, poses, phi = trial, trial_cost, tr, tterms, tposes, tphi
            if improvement < cfg.tolerance * max(cost, 1e-12) or np.abs(free).max() < 1e-6:
                break
        return pose, steps

    def _apply(self, pose: Pose, step: np.ndarray) -> Pose:
        out = pose.copy()
        out.translation = pose.translation + step[:3]
        turn = rotvec_to_matrix(step[3:].reshape(-1, 3))
        moved = special_procrustes(turn @ pose.rotations[self.bones])
        out.rotations[self.bones] = self.limits.clamp(moved)
        return out


def _cross(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """a x b over the last axis, broadcast (np.cross without its axis handling, which cost
    more than the products on the fit's small arrays)."""
    a0, a1, a2 = a[..., 0], a[..., 1], a[..., 2]
    b0, b1, b2 = b[..., 0], b[..., 1], b[..., 2]
    return np.stack([a1 * b2 - a2 * b1, a2 * b0 - a0 * b2, a0 * b1 - a1 * b0], axis=-1)


@dataclass
class BodyTracker:
    """One rig person's body over time: `update(points, confidence)` per frame."""

    model: AnnyModel
    config: FitConfig = field(default_factory=FitConfig)

    def __post_init__(self) -> None:
        fingers = self.config.fingers
        self.points = BodyKeypoints(self.model, fingers)
        fitted = BODY_BONES + (FINGER_BONES if fingers else ())
        self.solver = PoseSolver(self.model, self.points, self.config, fitted=fitted)
        # the window's: the body without the fingers, fitted to the points the fingers do not
        # move (with the finger joints in the window the synthetic walk's body keypoints came
        # out at 1.6x the triangulation's error instead of 1.1x)
        self.body_solver = (
            PoseSolver(self.model, self.points, self.config, fitted=BODY_BONES)
            if fingers
            else self.solver
        )
        self.finger_points = self.points.finger
        self.phenotype = np.full(6, 0.5)
        self.phenotype_final = False
        self._set_rest(self.model.rest(self.phenotype, vertices=False))
        self.pose: Pose | None = None
        self.window: list[tuple[np.ndarray, np.ndarray, Pose]] = []

    def targets(self, points: np.ndarray, confidence: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The mapped keypoints' targets [N, 3] and weights [N] (0 where NaN or below
        min_confidence) from the 308 triangulated ones."""
        points = np.asarray(points, dtype=np.float64)
        confidence = np.asarray(confidence, dtype=np.float64)
        if points.shape != (308, 3) or confidence.shape != (308,):
            raise BodyFitError(
                f"expected Sapiens2-308 points [308, 3] and confidence [308], got "
                f"{points.shape} and {confidence.shape}"
            )
        t = points[self.points.sapiens]
        c = confidence[self.points.sapiens]
        ok = np.isfinite(t).all(axis=1) & (c >= self.config.min_confidence)
        return np.where(ok[:, None], t, np.nan), np.where(ok, c, 0.0)

    def update(self, points: np.ndarray, confidence: np.ndarray) -> BodyFrame | None:
        """Fit this frame (None when fewer than min_points mapped keypoints have targets)."""
        targets, weights = self.targets(points, confidence)
        if int((weights > 0).sum()) < self.config.min_points:
            return None
        first = self.pose is None
        if first:
            self.phenotype = self._phenotype_from_segments(targets, weights)
            self._set_rest(self.model.rest(self.phenotype, vertices=False))
        solver, used = self._solver(weights)
        start = solver.initial_pose(targets, weights > 0) if self.pose is None else self.pose
        iterations = self.config.first_iterations if first else self.config.iterations
        pose, steps = solver.solve(start, start, targets, used, iterations)
        self.pose = pose
        if not self.phenotype_final:
            self.window.append((targets, used, pose))
            if len(self.window) >= self.config.window:
                self._fit_phenotype(weights)
                pose = self.pose
        fitted, _, _ = self.solver.keypoints(pose)
        residuals = np.where(weights > 0, np.linalg.norm(fitted - targets, axis=1), np.nan)
        return BodyFrame(
            pose.copy(), self.phenotype.copy(), self.phenotype_final, fitted, residuals, steps
        )

    def _solver(self, weights: np.ndarray) -> tuple[PoseSolver, np.ndarray]:
        """The solver of this frame and the weights it uses: in the window the body's, the
        finger joints past the base unweighted; then the whole one."""
        if self.phenotype_final:
            return self.solver, weights
        return self.body_solver, np.where(self.finger_points, 0.0, weights)

    def _set_rest(self, rest: RestBody) -> None:
        self.solver.set_rest(rest)
        if self.body_solver is not self.solver:
            self.body_solver.set_rest(rest)

    def _phenotype_from_segments(self, targets: np.ndarray, weights: np.ndarray) -> np.ndarray:
        """The phenotype whose rest-pose SEGMENTS lengths best match this frame's (damped
        Gauss-Newton, finite differences, clipped to [0, 1]); 0.5 each without enough."""
        index = {name: i for i, name in enumerate(self.points.names)}
        pairs = np.array([(index[a], index[b]) for a, b in SEGMENTS])
        seen = (weights[pairs] > 0).all(axis=1)
        phenotype = np.full(6, 0.5)
        if seen.sum() < 6:
            return phenotype
        pairs = pairs[seen]
        measured = np.linalg.norm(targets[pairs[:, 0]] - targets[pairs[:, 1]], axis=1)
        identity = np.tile(np.eye(3), (self.model.bone_count, 1, 1))

        def residual(phen: np.ndarray) -> np.ndarray:
            rest = self.model.rest(phen, vertices=False)
            anchors = self.points.anchors(rest)
            posed = self.model.pose(rest, identity, np.zeros(3))
            p = np.einsum("bij,nbj->ni", posed.transforms, anchors)
            lengths = np.linalg.norm(p[pairs[:, 0]] - p[pairs[:, 1]], axis=1)
            return np.concatenate([lengths - measured, self.config.phenotype_prior * (phen - 0.5)])

        damping = 1e-3
        r0 = residual(phenotype)
        for _ in range(12):
            jac = np.empty((r0.size, 6))
            for k in range(6):
                step = 1e-4 if phenotype[k] <= 0.5 else -1e-4
                shifted = phenotype.copy()
                shifted[k] += step
                jac[:, k] = (residual(shifted) - r0) / step
            h, g = jac.T @ jac, jac.T @ r0
            for _ in range(6):
                lhs = h + damping * np.diag(np.diag(h) + 1e-12)
                trial = np.clip(phenotype - np.linalg.solve(lhs, g), 0.0, 1.0)
                r1 = residual(trial)
                if r1 @ r1 < r0 @ r0:
                    phenotype, r0, damping = trial, r1, damping / 10.0
                    break
                damping *= 10.0
            else:
                break
        return phenotype

    def _window_residuals(self, phenotype: np.ndarray, poses: list[Pose]) -> np.ndarray:
        self.body_solver.set_rest(self.model.rest(phenotype, vertices=False))
        out = []
        for (targets, weights, _), pose in zip(self.window, poses, strict=True):
            fitted, _, _ = self.body_solver.keypoints(pose)
            r = np.where(weights[:, None] > 0, fitted - np.nan_to_num(targets), 0.0)
            out.append(np.sqrt(weights)[:, None] * r)
        return np.concatenate(out).ravel()

    def _fit_phenotype(self, weights: np.ndarray) -> None:
        """Alternate over the window: every frame's pose for the phenotype, then damped
        Gauss-Newton steps (finite-difference Jacobian, cost checked) on the phenotype for
        those poses, clipped to [0, 1]; then hold it."""
        cfg = self.config
        poses = [p for _, _, p in self.window]
        phenotype = self.phenotype.copy()
        prior = cfg.phenotype_prior
        damping = 1e-3

        def cost(phen: np.ndarray) -> tuple[float, np.ndarray]:
            r = np.concatenate([self._window_residuals(phen, poses), prior * (phen - 0.5)])
            return float(r @ r), r

        for _ in range(cfg.phenotype_rounds):
            self.body_solver.set_rest(self.model.rest(phenotype, vertices=False))
            poses = [
                self.body_solver.solve(p, p, t, w, cfg.iterations)[0]
                for (t, w, _), p in zip(self.window, poses, strict=True)
            ]
            current, r0 = cost(phenotype)
            jac = np.empty((r0.size, 6))
            for k in range(6):
                step = 1e-4 if phenotype[k] <= 0.5 else -1e-4
                shifted = phenotype.copy()
                shifted[k] += step
                jac[:, k] = (cost(shifted)[1] - r0) / step
            h, g = jac.T @ jac, jac.T @ r0
            for _ in range(8):
                trial = np.clip(
                    phenotype - np.linalg.solve(h + damping * np.diag(np.diag(h) + 1e-12), g),
                    0.0,
                    1.0,
                )
                if cost(trial)[0] < current:
                    phenotype, damping = trial, damping / 10.0
                    break
                damping *= 10.0
        self.phenotype = phenotype
        self.phenotype_final = True
        self._set_rest(self.model.rest(phenotype, vertices=False))
        last = poses[-1]
        # the last frame again with its own weights (with fingers: every point, the fingers
        # from their rest pose)
        steps = cfg.first_iterations if cfg.fingers else cfg.iterations
        self.pose = self.solver.solve(last, last, self.window[-1][0], weights, steps)[0]
        self.window = []
