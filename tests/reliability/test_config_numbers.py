"""Config numbers that are not sane (issue 33, low finding): `staleness_ms = inf`,
`fps = 1e-300` and `stats_interval_s = 1e-9` passed `validate` and broke `run` silently. Now
every config number, of the file's sections and of every stage's options, is finite and at
most 1e15, and a time (a key ending in _s or _ms) is 0 or between a microsecond and a day
(pipeline/config.py sane_number); a camera's fps is within 0.001-1000, stats come at most
every 0.05 s. `validate` names the key.
"""

from __future__ import annotations

import pytest

from pipeline.cli import main

CASES = {
    "staleness inf": ("[[cameras]]", "staleness_ms = inf",
                      "cameras[0].staleness_ms: inf is not a finite number"),
    "staleness nan": ("[[cameras]]", "staleness_ms = nan",
                      "cameras[0].staleness_ms: expected a value > 0.0 (got a number: nan)"),
    "fps 1e-300": ("[[cameras]]", "fps = 1e-300", "cameras[0].fps: expected a value >= 0.001"),
    "stats 1e-9": ("[metrics]", "stats_interval_s = 1e-9",
                   "metrics.stats_interval_s: 1e-09 s is under a microsecond"),
    "stats 1e-3": ("[metrics]", "stats_interval_s = 1e-3",
                   "metrics.stats_interval_s: 0.001 s is under 0.05 s"),
    "drain 1e300": ("[pipeline]", "drain_timeout_s = 1e300",
                    "pipeline.drain_timeout_s: 1e+300 is beyond any sane value"),
    "stage option inf": ("[[stages]]", "preview_fps = inf",
                         "stages[1].preview_fps: inf is not a finite number"),
    "stage time 1e8 ms": ("[[stages]]", "linger_ms = 100000000",
                          "stages[1].linger_ms: 1e+08 ms is over a day"),
}  # fmt: skip


def config_with(section: str, line: str) -> str:
    text = {
        "[pipeline]": "[pipeline]\n",
        "[metrics]": "[metrics]\n",
        "[[cameras]]": "",
        "[[stages]]": "",
    }[section]
    if section in ("[pipeline]", "[metrics]"):
        text += line + "\n"
    camera = '[[cameras]]\nname = "a"\nurl = "synthetic:"\n'
    if section == "[[cameras]]":
        camera += line + "\n"
    publish = '[[stages]]\nkind = "publish"\nbind = "tcp://127.0.0.1:*"\n'
    if section == "[[stages]]":
        publish += line + "\n"
    return text + camera + '[[stages]]\nkind = "capture"\n' + publish


@pytest.mark.parametrize("case", CASES)
def test_validate_refuses_a_number_that_is_not_sane_naming_the_key(tmp_path, capsys, case):
    section, line, problem = CASES[case]
    path = tmp_path / "run.toml"
    path.write_text(config_with(section, line))
    assert main(["validate", str(path)]) == 2
    err = capsys.readouterr().err
    assert f"{path}: {problem}" in err, err
    assert "Traceback" not in err


def test_the_same_config_with_sane_numbers_validates(tmp_path, capsys):
    path = tmp_path / "run.toml"
    path.write_text(config_with("[metrics]", "stats_interval_s = 0.05"))
    assert main(["validate", str(path)]) == 0, capsys.readouterr().err
