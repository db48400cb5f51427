""".ci/no_import_cycles.py (the lint `make lint` runs): it finds a circle through an import inside
a function, ignores imports under `if TYPE_CHECKING:`, and finds none in npu/, stages/ and
pipeline/ as committed (issue 28)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / ".ci" / "no_import_cycles.py"


def _lint():
    spec = importlib.util.spec_from_file_location("no_import_cycles", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    assert spec.loader is not None
    spec.loader.exec_module(module)
    return module


def _package(tmp_path: Path, files: dict[str, str]) -> Path:
    root = tmp_path / "pkg"
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return root


def test_a_circle_through_a_function_level_import_is_found(tmp_path):
    # the shape npu.models had: the registry loads the synthetic models inside load(), and
    # they look their specs up in the registry
    root = _package(
        tmp_path,
        {
            "__init__.py": "",
            "models/__init__.py": "def load():\n    from pkg.models import synthetic\n",
            "models/synthetic.py": "def module():\n    from pkg.models import spec\n",
            "other.py": "import pkg.models\n",
        },
    )
    lint = _lint()
    assert lint.circles(lint.graph(root)) == [["pkg.models", "pkg.models.synthetic"]]


def test_imports_for_type_checking_only_make_no_circle(tmp_path):
    root = _package(
        tmp_path,
        {
            "__init__.py": "",
            "registry.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
            "    from pkg.spec import Spec\n",
            "spec.py": "from pkg.registry import Kind\n",
        },
    )
    lint = _lint()
    assert lint.circles(lint.graph(root)) == []


def test_the_committed_packages_have_no_import_circle():
    done = subprocess.run(
        [sys.executable, str(SCRIPT)], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stdout
