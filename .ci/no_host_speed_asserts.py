"""Lint: no default-run test compares a wall-clock duration or rate to a constant.

A test asserts behaviour; the host's speed is a benchmark (bench/) or a `slow` test comparing
two runs made back to back (docs/architecture.md "Testing"). This check reads every test
module under tests/ (an AST walk, not a regex, so names carry through assignments) and reports
an ordered comparison (<, <=, >, >=) in an `assert` whose one side reads the wall clock
(time.monotonic, perf_counter, time.time, process_time, thread_time, their _ns forms) or a
name computed from such a read in the same function, and whose other side is not another
clock read (the order of two stamps is behaviour). Tests marked slow, by decorator or by the
module's `pytestmark`, are not in the default run and are skipped.

The rare legitimate case (a hang guard: a wait that must end, with a bound far above any
host's time; a lower bound, which a loaded host cannot break) carries `# wall-clock-ok: <why>`
on the assert's first line or in the comment lines right above it.

Usage: python .ci/no_host_speed_asserts.py [paths...]  (default: tests/); exit 1 on findings.
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterator
from pathlib import Path

CLOCKS = {
    "monotonic",
    "monotonic_ns",
    "perf_counter",
    "perf_counter_ns",
    "process_time",
    "process_time_ns",
    "thread_time",
    "thread_time_ns",
    "time",
    "time_ns",
}
MARKER = "# wall-clock-ok:"
ORDERED = (ast.Lt, ast.LtE, ast.Gt, ast.GtE)


def _is_clock_call(node: ast.AST) -> bool:
    """time.monotonic() and friends, or a bare monotonic() / perf_counter() imported by name
    (a bare `time()` only as the attribute form: too many things are called time)."""
    if not isinstance(node, ast.Call):
        return False
    f = node.func
    if isinstance(f, ast.Attribute) and f.attr in CLOCKS:
        return isinstance(f.value, ast.Name) and f.value.id == "time"
    return isinstance(f, ast.Name) and f.id in CLOCKS - {"time"}


def _reads_clock(node: ast.AST, wall: set[str]) -> bool:
    return any(
        _is_clock_call(n) or (isinstance(n, ast.Name) and n.id in wall) for n in ast.walk(node)
    )


def _wall_names(func: ast.AST) -> set[str]:
    """Names assigned (directly or through other such names) from a clock read in func."""
    wall: set[str] = set()
    assigns = [n for n in ast.walk(func) if isinstance(n, ast.Assign | ast.AugAssign)]
    changed = True
    while changed:
        changed = False
        for a in assigns:
            if not _reads_clock(a.value, wall):
                continue
            targets = a.targets if isinstance(a, ast.Assign) else [a.target]
            for t in targets:
                for n in ast.walk(t):
                    if isinstance(n, ast.Name) and n.id not in wall:
                        wall.add(n.id)
                        changed = True
    return wall


def _marked(lines: list[str], line: int) -> bool:
    """The marker on the assert's first line or in the comment lines right above it."""
    if MARKER in lines[line - 1]:
        return True
    i = line - 2
    while i >= 0 and lines[i].strip().startswith("#"):
        if lines[i].strip().startswith(MARKER):
            return True
        i -= 1
    return False


def _marked_slow(decorators: list[ast.expr]) -> bool:
    return any("slow" in ast.unparse(d) for d in decorators)


def _findings_in(func: ast.AST, lines: list[str]) -> Iterator[int]:
    wall = _wall_names(func)
    for node in ast.walk(func):
        if not isinstance(node, ast.Assert):
            continue
        for cmp in (n for n in ast.walk(node.test) if isinstance(n, ast.Compare)):
            sides = [cmp.left, *cmp.comparators]
            for op, a, b in zip(cmp.ops, sides[:-1], sides[1:], strict=True):
                if not isinstance(op, ORDERED):
                    continue
                wa, wb = _reads_clock(a, wall), _reads_clock(b, wall)
                if wa != wb:  # one side is the clock, the other is not: a bound
                    if not _marked(lines, node.lineno):
                        yield node.lineno
                    break
            else:
                continue
            break


def check_file(path: Path) -> list[str]:
    text = path.read_text()
    tree = ast.parse(text, str(path))
    lines = text.splitlines()
    if any(
        isinstance(n, ast.Assign)
        and any(isinstance(t, ast.Name) and t.id == "pytestmark" for t in n.targets)
        and "slow" in ast.unparse(n.value)
        for n in tree.body
    ):
        return []
    out = []
    tops = [n for n in tree.body if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)]
    for cls in (n for n in tree.body if isinstance(n, ast.ClassDef)):
        tops += [n for n in cls.body if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)]
    for f in tops:
        if _marked_slow(f.decorator_list):
            continue
        for line in sorted(set(_findings_in(f, lines))):
            text = lines[line - 1].strip()
            out.append(f"{path}:{line}: wall-clock bound in a default-run test: {text}")
    return out


def main(argv: list[str]) -> int:
    roots = [Path(a) for a in argv] or [Path("tests")]
    files = sorted(p for r in roots for p in ([r] if r.is_file() else r.rglob("*.py")))
    findings = [f for p in files for f in check_file(p)]
    for f in findings:
        print(f)
    if findings:
        print(
            f"{len(findings)} wall-clock bound(s): assert behaviour on an injected clock, move "
            f"the measurement to bench/ or a slow test, or justify it with '{MARKER} <why>'",
            file=sys.stderr,
        )
    return 1 if findings else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
