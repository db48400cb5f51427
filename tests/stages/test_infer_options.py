"""An infer stage's config checks (stages/infer_options.py): `npucam validate` refuses an
enabled model whose jobs no stage of the config makes, naming the config, the model and what
would make them; a producer (detect's targets, dark's face points) satisfies it."""

from __future__ import annotations

from pipeline.cli import main

CONFIG = """
[[cameras]]
name = "cam"
url = "synthetic:"

[[stages]]
kind = "capture"

[[stages]]
kind = "detect"
to = ["publish", "align"]
face = "{face}"

[[stages]]
kind = "align"

[[stages]]
kind = "infer"
backend = "sim"
to = ["dark", "face_match"]
[stages.sapiens2]
enabled = true
synthetic = true
[stages.adaface]
enabled = true
synthetic = true

[[stages]]
kind = "dark"
face_points = {face_points}
to = ["publish"]

[[stages]]
kind = "face_match"
to = ["publish"]

[[stages]]
kind = "publish"
bind = "tcp://127.0.0.1:0"
"""


def validate(path, capsys) -> tuple[int, str]:
    code = main(["validate", str(path)])
    return code, capsys.readouterr().err


def test_validate_refuses_a_face_model_when_no_stage_finds_faces(write_config, capsys):
    path = write_config(CONFIG.format(face="none", face_points="false"))
    code, err = validate(path, capsys)
    assert code == 2
    assert (
        f"{path}: stages[3].adaface: enabled, but no stage of this config makes its jobs "
        "(FaceJob; it runs on face targets (interval cadence): a detect stage whose keys "
        "find them and leave its jobs on)"
    ) in err
    assert "sapiens2" not in err  # its person targets come from the detect stage


def test_a_face_detector_or_the_dark_stages_face_points_make_face_jobs(write_config, capsys):
    for face, points in (("blazeface", "false"), ("none", "true")):
        path = write_config(CONFIG.format(face=face, face_points=points))
        code, err = validate(path, capsys)
        assert (code, "no stage of this config makes" in err) == (0, False), (face, err)


def test_detect_keys_that_turn_a_models_jobs_off_leave_it_without_a_producer(write_config, capsys):
    text = CONFIG.format(face="blazeface", face_points="false").replace(
        'face = "blazeface"', 'face = "blazeface"\nfaces = false\npose = false'
    )
    code, err = validate(write_config(text), capsys)
    assert code == 2
    assert "stages[3].sapiens2: enabled, but no stage" in err
    assert "stages[3].adaface: enabled, but no stage" in err
