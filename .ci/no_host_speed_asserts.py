"""Lint: no default-run test compares a wall-clock duration, a rate or a count over a fixed
wall-clock window to a constant.

A test asserts behaviour; the host's speed is a benchmark (bench/) or a `slow` test comparing
two runs made back to back (docs/architecture.md "Testing"). This check reads every test
module under tests/ (an AST walk, not a regex, so names carry through assignments, helper
arguments and helper return values within a module) and reports an `assert` with an ordered
comparison (<, <=, >, >=) of one of two kinds:
- a bound on the clock: one side reads the wall clock (time.monotonic, perf_counter,
  time.time, process_time, thread_time, their _ns forms, pipeline.messages.now_ns, a
  Recorder's `received_ns` arrival stamp) or a name, list, argument or helper result computed
  from such a read, and the other side does not (the order of two stamps is behaviour; a
  `len()` of stamps is a count, not a time);
- a count over a fixed window: after a real sleep of a fixed time (time.sleep or
  asyncio.sleep, not one inside a `while` poll loop, which waits for a condition) in the same
  test, a lower bound (x >= n, x > n) whose bound holds a number other than 0 or 1 or an
  UPPER_CASE constant: how much happened in wall time is the host's speed ("it happened",
  x >= 1 or x > before, is behaviour).
Tests marked slow, by decorator or by the module's `pytestmark`, are not in the default run
and are skipped.

The rare legitimate case (a hang guard: a wait that must end, with a bound far above any
host's time; an upper bound on attempts, which a loaded host cannot break) carries
`# wall-clock-ok: <why>` on the assert's first line or in the comment lines right above it.

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
BARE_CLOCKS = (CLOCKS - {"time"}) | {"now_ns"}  # now_ns: pipeline.messages' wall clock
STAMPS = {"received_ns"}  # arrival stamps the tests' recorders take on the wall clock
SLEEPS = {"sleep"}  # time.sleep / asyncio.sleep
# calls whose result carries their arguments' values (a bare name or a method's name)
PASS_THROUGH = {
    *("abs", "min", "max", "sum", "sorted", "float", "int", "round", "list", "tuple"),
    *("zip", "enumerate", "reversed", "next", "map", "filter", "array", "asarray"),
    *("median", "mean", "percentile", "quantile", "diff"),
}
MARKER = "# wall-clock-ok:"
ORDERED = (ast.Lt, ast.LtE, ast.Gt, ast.GtE)
Func = ast.FunctionDef | ast.AsyncFunctionDef


def _is_clock_call(node: ast.AST, helpers: dict[str, set[int] | None]) -> bool:
    """time.monotonic() and friends, a bare monotonic() / now_ns() imported by name (a bare
    `time()` only as the attribute form: too many things are called time), or a call of one
    of this module's functions whose whole result is a clock read."""
    if not isinstance(node, ast.Call):
        return False
    f = node.func
    if isinstance(f, ast.Attribute) and f.attr in CLOCKS:
        return isinstance(f.value, ast.Name) and f.value.id == "time"
    if isinstance(f, ast.Name) and f.id in BARE_CLOCKS:
        return True
    helper = _helper_called(node)
    return helper is not None and helper in helpers and helpers[helper] is None


def _passes_value(call: ast.Call) -> bool:
    """A call whose result carries its arguments' values (abs, max, sorted, np.median, ...);
    any other call's result is its own (a frame stamped now is not a time)."""
    f = call.func
    name = f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else ""
    return name in PASS_THROUGH


def _walk_value(node: ast.AST) -> Iterator[ast.AST]:
    """ast.walk over what makes a value: into the arguments of value-carrying calls only, not
    into len(...) (a count of stamps is not a time), nor a comprehension's `if` filters
    (stats chosen by their time are not a time)."""
    todo = [node]
    while todo:
        n = todo.pop()
        yield n
        if isinstance(n, ast.Call):
            todo.append(n.func)
            if _passes_value(n):
                todo.extend([*n.args, *(k.value for k in n.keywords)])
        elif isinstance(n, ast.comprehension):
            todo.extend([n.target, n.iter])
        else:
            todo.extend(ast.iter_child_nodes(n))


def _reads_clock(node: ast.AST, wall: set[str], helpers: dict[str, set[int] | None]) -> bool:
    return any(
        _is_clock_call(n, helpers)
        or (isinstance(n, ast.Name) and n.id in wall)
        or (isinstance(n, ast.Attribute) and n.attr in STAMPS)
        for n in _walk_value(node)
    )


def _helper_called(value: ast.AST) -> str | None:
    """The module function whose result `value` is: f(...), await f(...), asyncio.run(f())."""
    while True:
        if isinstance(value, ast.Await):
            value = value.value
        elif (
            isinstance(value, ast.Call)
            and isinstance(value.func, ast.Attribute | ast.Name)
            and (value.func.attr if isinstance(value.func, ast.Attribute) else value.func.id)
            in ("run", "wait_for", "to_thread")
            and value.args
        ):
            value = value.args[0]
        elif isinstance(value, ast.Call) and isinstance(value.func, ast.Name):
            return value.func.id
        else:
            return None


def _wall_names(func: ast.AST, params: set[str], helpers: dict[str, set[int] | None]) -> set[str]:
    """Names assigned (directly or through other such names) from a clock read in func, and
    its parameters that callers fill from one (`params`); a tuple unpacked from a helper's
    result takes the clock at the positions the helper returns one."""
    wall = set(params)
    grows = [  # xs.append(v), xs.extend(vs), xs.insert(i, v): (xs, the call); xs holds v
        (n.func.value.id, n)
        for n in ast.walk(func)
        if isinstance(n, ast.Call)
        and isinstance(n.func, ast.Attribute)
        and n.func.attr in ("append", "extend", "insert")
        and isinstance(n.func.value, ast.Name)
    ]
    assigns = [
        n
        for n in ast.walk(func)
        if isinstance(n, ast.Assign | ast.AugAssign | ast.AnnAssign | ast.For | ast.comprehension)
    ]
    changed = True
    while changed:
        changed = False
        for a in assigns:
            value = a.iter if isinstance(a, ast.For | ast.comprehension) else a.value
            if value is None:
                continue
            targets = a.targets if isinstance(a, ast.Assign) else [a.target]
            positions = helpers.get(_helper_called(value) or "")
            names: list[str] = []
            for t in targets:
                if positions and isinstance(t, ast.Tuple):
                    elts = [e for i, e in enumerate(t.elts) if i in positions]
                elif (  # a, b = x, y: each target what its own value is
                    isinstance(t, ast.Tuple)
                    and isinstance(value, ast.Tuple)
                    and len(t.elts) == len(value.elts)
                ):
                    pairs = zip(t.elts, value.elts, strict=True)
                    elts = [e for e, v in pairs if _reads_clock(v, wall, helpers)]
                elif _reads_clock(value, wall, helpers):
                    elts = [t]
                else:
                    elts = []
                names += [n.id for e in elts for n in ast.walk(e) if isinstance(n, ast.Name)]
            for name in names:
                if name not in wall:
                    wall.add(name)
                    changed = True
        for name, call in grows:
            if name not in wall and any(_reads_clock(a, wall, helpers) for a in call.args):
                wall.add(name)
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


def _param_names(f: Func) -> list[str]:
    a = f.args
    return [p.arg for p in [*a.posonlyargs, *a.args, *a.kwonlyargs]]


def _own_nodes(f: Func) -> Iterator[ast.AST]:
    """ast.walk over f's body, not into the functions defined inside it."""
    todo: list[ast.AST] = list(f.body)
    while todo:
        n = todo.pop()
        yield n
        if not isinstance(n, Func):
            todo.extend(ast.iter_child_nodes(n))


class Module:
    """One test module's functions, which of them return a clock read and which of their
    parameters are filled from one, found together by iterating to a fixed point. A call by
    name resolves to a function defined in the same test first (each test's own `main`),
    then to the module's."""

    def __init__(self, tree: ast.Module) -> None:
        self.tops: list[Func] = [n for n in tree.body if isinstance(n, Func)]
        for cls in (n for n in tree.body if isinstance(n, ast.ClassDef)):
            self.tops += [m for m in cls.body if isinstance(m, Func)]
        self._module = {f.name: f for f in self.tops}
        self._scopes: dict[int, dict[str, Func]] = {}  # id(function) -> names it can call
        self._funcs: list[Func] = []
        for top in self.tops:
            scope = dict(self._module)
            scope.update({n.name: n for n in ast.walk(top) if isinstance(n, Func) and n is not top})
            for f in (n for n in ast.walk(top) if isinstance(n, Func)):
                self._scopes[id(f)] = scope
                self._funcs.append(f)
        self._results: dict[int, set[int] | None] = {id(f): set() for f in self._funcs}
        self._params: dict[int, set[str]] = {id(f): set() for f in self._funcs}
        self._settle()

    def helpers(self, f: Func) -> dict[str, set[int] | None]:
        """What each function f can call returns: None (a clock read), or the tuple positions
        that are one."""
        return {name: self._results[id(g)] for name, g in self._scopes[id(f)].items()}

    def wall(self, f: Func) -> set[str]:
        params = set().union(*(self._params[id(n)] for n in ast.walk(f) if isinstance(n, Func)))
        return _wall_names(f, params, self.helpers(f))

    def _returned_clock(self, f: Func, wall: set[str]) -> set[int] | None:
        """None: the whole result is a clock read; else the tuple positions that are."""
        helpers = self.helpers(f)
        returns = [n.value for n in _own_nodes(f) if isinstance(n, ast.Return) and n.value]
        if returns and all(isinstance(r, ast.Tuple) for r in returns):
            return {
                i for r in returns for i, e in enumerate(r.elts) if _reads_clock(e, wall, helpers)
            }
        return None if any(_reads_clock(r, wall, helpers) for r in returns) else set()

    def _settle(self) -> None:
        changed = True
        while changed:
            changed = False
            for f in self._funcs:
                wall = self.wall(f)
                found = self._returned_clock(f, wall)
                if found != self._results[id(f)]:
                    self._results[id(f)] = found
                    changed = True
                scope, helpers = self._scopes[id(f)], self.helpers(f)
                for call in (n for n in _own_nodes(f) if isinstance(n, ast.Call)):
                    callee = scope.get(call.func.id) if isinstance(call.func, ast.Name) else None
                    if callee is None:
                        continue
                    names = _param_names(callee)
                    filled = list(zip(names, call.args, strict=False)) + [
                        (k.arg, k.value) for k in call.keywords if k.arg in names
                    ]
                    for param, arg in filled:
                        if param not in self._params[id(callee)] and _reads_clock(
                            arg, wall, helpers
                        ):
                            self._params[id(callee)].add(param)
                            changed = True


def _is_real_sleep(node: ast.AST) -> bool:
    """time.sleep(x) / asyncio.sleep(x) with x not 0 (sleep(0) only yields)."""
    if not (isinstance(node, ast.Call) and node.args):
        return False
    f = node.func
    named = (isinstance(f, ast.Attribute) and f.attr in SLEEPS) or (
        isinstance(f, ast.Name) and f.id in SLEEPS
    )
    arg = node.args[0]
    return named and not (isinstance(arg, ast.Constant) and arg.value == 0)


def _stamped(node: ast.AST) -> bool:
    """The side names a stamp (an attribute or key ending in _ns or _ts): compared with a
    clock read, that is the order of two stamps."""
    return any(
        (isinstance(n, ast.Attribute) and n.attr.endswith(("_ns", "_ts")))
        or (
            isinstance(n, ast.Constant)
            and isinstance(n.value, str)
            and n.value.endswith(("_ns", "_ts"))
        )
        for n in ast.walk(node)
    )


def _outside_subscripts(node: ast.AST) -> Iterator[ast.AST]:
    todo = [node]
    while todo:
        n = todo.pop()
        yield n
        todo.extend([n.value] if isinstance(n, ast.Subscript) else ast.iter_child_nodes(n))


def _sizeable(node: ast.AST) -> bool:
    """The bound holds a number other than 0 or 1 (not an index), or an UPPER_CASE constant."""
    return any(
        (
            isinstance(n, ast.Constant)
            and isinstance(n.value, int | float)
            and not isinstance(n.value, bool)
            and n.value not in (0, 1)
        )
        or (isinstance(n, ast.Name) and n.id.isupper() and len(n.id) > 1)
        for n in _outside_subscripts(node)
    )


def _bounds(test: ast.AST) -> Iterator[tuple[ast.AST, ast.AST, ast.AST]]:
    """(op, left, right) of every ordered comparison in an assert's test."""
    for cmp in (n for n in ast.walk(test) if isinstance(n, ast.Compare)):
        sides = [cmp.left, *cmp.comparators]
        for op, a, b in zip(cmp.ops, sides[:-1], sides[1:], strict=True):
            if isinstance(op, ORDERED):
                yield op, a, b


def _findings_in(func: Func, module: Module, lines: list[str]) -> Iterator[tuple[int, str]]:
    wall, helpers = module.wall(func), module.helpers(func)
    polled = {id(n) for w in ast.walk(func) if isinstance(w, ast.While) for n in ast.walk(w)}
    sleeps = [n.lineno for n in ast.walk(func) if _is_real_sleep(n) and id(n) not in polled]
    for node in ast.walk(func):
        if not isinstance(node, ast.Assert) or _marked(lines, node.lineno):
            continue
        for op, a, b in _bounds(node.test):
            wa, wb = _reads_clock(a, wall, helpers), _reads_clock(b, wall, helpers)
            if wa != wb and not _stamped(b if wa else a):  # a clock read bounded
                yield node.lineno, "wall-clock bound"
                break
            # x >= n / x > n, or n <= x / n < x: the bound is the smaller side
            low, high = (b, a) if isinstance(op, ast.Gt | ast.GtE) else (a, b)
            if (
                any(s < node.lineno for s in sleeps)
                and not wa
                and _sizeable(low)
                and not _sizeable(high)
            ):
                yield node.lineno, "count over a fixed sleep"
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
    module = Module(tree)
    found: dict[int, str] = {}
    for f in module.tops:
        if _marked_slow(f.decorator_list):
            continue
        for line, kind in _findings_in(f, module, lines):
            found.setdefault(line, kind)
    return [
        f"{path}:{line}: {kind} in a default-run test: {lines[line - 1].strip()}"
        for line, kind in sorted(found.items())
    ]


def main(argv: list[str]) -> int:
    roots = [Path(a) for a in argv] or [Path("tests")]
    files = sorted(p for r in roots for p in ([r] if r.is_file() else r.rglob("*.py")))
    findings = [f for p in files for f in check_file(p)]
    for f in findings:
        print(f)
    if findings:
        print(
            f"{len(findings)} host-speed bound(s): assert behaviour on an injected clock, move "
            f"the measurement to bench/ or a slow test, or justify it with '{MARKER} <why>'",
            file=sys.stderr,
        )
    return 1 if findings else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
