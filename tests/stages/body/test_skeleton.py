"""stages/body/skeleton.py is the model file's rig: the same 104 bones, in order, with the
same parents."""

from __future__ import annotations

from stages.body import skeleton
from stages.body.mesh_topic import VERTEX_COUNT


def test_the_skeleton_constants_are_the_model_files_bones_and_parents(body_model):
    assert list(skeleton.NAMES) == body_model.bone_labels
    assert list(skeleton.PARENTS) == body_model.parents.tolist()
    assert len(skeleton.NAMES) == 104


def test_the_meshs_vertex_count_in_meta_is_the_model_files(body_model):
    assert len(body_model.template_vertices) == VERTEX_COUNT
