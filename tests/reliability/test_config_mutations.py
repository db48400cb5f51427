"""`npucam validate` on mutations of configs/demo.toml (issue 18, finding 11): a seeded loop of
line and value mutations (delete, duplicate, swap and flip lines; replace values with long
strings, huge numbers, odd stage kinds and urls) run through the CLI itself. Each must end
with exit 0 or 2, print no traceback, and raise nothing but the project's errors; and
validate never imports a module a `kind = "module:Class"` names (`this:Stage` used to print
the Zen of Python).

NPUCAM_CONFIG_MUTATIONS sets the number of mutations (default 150, under 30 s on the shared
2 cores; 3000 were run once for the report).
"""

from __future__ import annotations

import contextlib
import io
import os
import random
import re
import shutil
import sys
from pathlib import Path

import pytest

from pipeline.cli import main
from pipeline.config import ConfigError
from pipeline.errors import NpucamError
from pipeline.graph import load

REPO = Path(__file__).resolve().parents[2]
DEMO = (REPO / "configs" / "demo.toml").read_text()
MUTATIONS = int(os.environ.get("NPUCAM_CONFIG_MUTATIONS", "150"))

KINDS = [
    '":Y"',
    '".x:Y"',
    '"..x:Y"',
    '"this:Stage"',
    '"antigravity:Stage"',
    '"os:system"',
    '"a:b:c"',
    '"stages.detect:Nope"',
    '"pipeline.graph:Stage"',
    '"' + "x" * 300 + '"',
]
URLS = [
    '"sample:' + "b" * 300 + '.mp4"',
    '"' + "/tmp/" + "d" * 260 + '/clip.mp4"',
    '"file:' + "f" * 4000 + '"',
    '"images:' + "i" * 256 + '"',
    '"zmq:tcp://127.0.0.1:' + "9" * 300 + '"',
    '"rtsp://' + "h" * 300 + '/s"',
    '"synthetic:?width=' + "9" * 300 + '"',
    '"../README.md"',
    '"/dev/zero"',
]
PATHS = ['"/dev/zero"', '"/etc"', '"/"', '"../configs"', '"../README.md"', '"' + "p" * 300 + '"']
ODD_VALUES = [
    *KINDS,
    *URLS,
    *PATHS,
    '"\\u0000"',
    '""',
    "1" + "0" * 400,
    "-1",
    "0",
    "1e308",
    "-1e308",
    "nan",
    "inf",
    "4",
    "true",
    "[]",
    "{}",
    '["' + "y" * 300 + '"]',
    "[1, 2, 3]",
    '{ size = 0, policy = "x" }',
]
POOLS = {"kind": KINDS, "url": URLS, "bundle": PATHS, "gallery": PATHS, "labels_file": PATHS}


OPENED_KEYS = r"^\s*(kind|url|bundle|gallery|labels_file|bind|kernel)\s*="


def mutate(text: str, rng: random.Random) -> str:
    """One to three random mutations of the config's lines."""
    lines = text.split("\n")
    for _ in range(rng.randint(1, 3)):
        i = rng.randrange(len(lines))
        op = rng.randrange(9)
        if op == 0:
            del lines[i]
        elif op == 1:
            lines.insert(i, lines[i])
        elif op == 2:
            j = rng.randrange(len(lines))
            lines[i], lines[j] = lines[j], lines[i]
        elif op == 3 and lines[i]:
            k = rng.randrange(len(lines[i]))
            lines[i] = lines[i][:k] + chr(rng.randrange(32, 127)) + lines[i][k + 1 :]
        elif op in (4, 5):  # a value replaced, at a key the config has
            m = re.match(r"^(\s*[A-Za-z0-9_.]+\s*=\s*)(.*)$", lines[i])
            if m:
                lines[i] = m.group(1) + rng.choice(ODD_VALUES)
        else:  # the value of a key run opens or imports (kind, url, a path) made odd
            keyed = [k for k, line in enumerate(lines) if re.match(OPENED_KEYS, line)]
            k = rng.choice(keyed) if keyed else i
            key = lines[k].split("=")[0].strip() if keyed else "kind"
            lines[k] = f"{key} = {rng.choice(POOLS.get(key, ODD_VALUES))}"
    return "\n".join(lines)


def validate(path: Path) -> tuple[int, str, str]:
    """`npucam validate PATH` in this process: (exit code, stdout, stderr). Any exception
    other than SystemExit (argparse) escaping main() fails the test."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(["validate", str(path)])
    return code, out.getvalue(), err.getvalue()


@pytest.fixture
def workdir(tmp_path):
    """A configs/ folder beside a link to the repository's .cache, so the demo's relative
    paths (../.cache/npucam/...) mean what they mean in the repository."""
    (tmp_path / "configs").mkdir()
    if (REPO / ".cache").exists():
        (tmp_path / ".cache").symlink_to(REPO / ".cache")
    return tmp_path / "configs"


def test_mutated_demo_configs_give_only_project_errors_and_no_traceback(workdir):
    rng = random.Random(20240518)
    seen_modules = set(sys.modules)
    outcomes = {0: 0, 2: 0}
    for n in range(MUTATIONS):
        text = mutate(DEMO, rng)
        path = workdir / f"m{n}.toml"
        path.write_text(text)
        try:
            code, out, err = validate(path)
        except Exception as exc:  # noqa: BLE001 - the assertion is that nothing escapes
            pytest.fail(f"mutation {n} raised {type(exc).__name__}: {exc}\n--- config ---\n{text}")
        assert code in (0, 2), (n, code, err)
        assert "Traceback" not in out + err, f"mutation {n}:\n{err}\n--- config ---\n{text}"
        assert "Beautiful is better than ugly" not in out, f"mutation {n} imported `this`"
        outcomes[code] += 1
        path.unlink()
    imported = {m for m in set(sys.modules) - seen_modules if m in ("this", "antigravity")}
    assert not imported, f"validate imported {imported}"
    assert outcomes[0] and outcomes[2], outcomes  # the mutations reach both outcomes
    print(f"{MUTATIONS} mutations: {outcomes[0]} valid, {outcomes[2]} refused")


@pytest.mark.parametrize("kind", [":Y", ".x:Y", "..x:Y", "x.:Y", "a:b:c", ":", "x:", "1x:Y"])
def test_malformed_stage_kinds_are_config_errors_naming_the_key(tmp_path, kind):
    path = tmp_path / "c.toml"
    path.write_text(f'[[stages]]\nkind = "{kind}"\n')
    with pytest.raises(ConfigError, match=r"stages\[0\]\.kind: "):
        load(str(path))


def test_validate_checks_a_module_kind_by_name_only_and_run_imports_it(tmp_path, capsys):
    path = tmp_path / "c.toml"
    path.write_text(
        '[[cameras]]\nname = "a"\nurl = "synthetic:"\n'
        '[[stages]]\nkind = "capture"\n[[stages]]\nkind = "this:Stage"\n'
    )
    sys.modules.pop("this", None)
    code, out, err = validate(path)
    assert code == 0 and "ok" in out
    assert "this" not in sys.modules and "Beautiful is better" not in out + err
    assert "stages[1].kind: 'this:Stage' is not a registered stage kind" in err
    # --import (and run, which always imports) import it and find it is not a Stage
    match = r"stages\[1\]\.kind: .*this:Stage is not a Stage"
    with contextlib.redirect_stdout(io.StringIO()), pytest.raises(ConfigError, match=match):
        load(str(path), import_modules=True)
    sys.modules.pop("this", None)


def test_a_module_kind_whose_import_raises_is_a_config_error(tmp_path, monkeypatch):
    (tmp_path / "boom_stage.py").write_text("raise RuntimeError('import-time failure')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    path = tmp_path / "c.toml"
    path.write_text('[[stages]]\nkind = "boom_stage:Stage"\n')
    with pytest.raises(ConfigError, match="cannot import boom_stage: RuntimeError: import-time"):
        load(str(path), import_modules=True)


@pytest.mark.parametrize(
    "url", ["sample:" + "b" * 300 + ".mp4", "d" * 300 + ".mp4", "images:" + "i" * 300]
)
def test_camera_urls_longer_than_a_file_name_are_config_errors(tmp_path, url):
    path = tmp_path / "c.toml"
    path.write_text(f'[[cameras]]\nname = "a"\nurl = "{url}"\n[[stages]]\nkind = "capture"\n')
    with pytest.raises(NpucamError, match=r"cameras\[0\]\.url: "):
        load(str(path))


def test_the_unmutated_demo_validates_in_the_fuzzers_folder(workdir):
    path = workdir / "demo.toml"
    shutil.copy(REPO / "configs" / "demo.toml", path)
    code, out, err = validate(path)
    assert code == 0, err
