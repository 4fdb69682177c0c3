"""Tests wait on a state, never on the clock: a static check of tests/unit,
tests/integration and tests/fixtures (tests/dags is left out: its DAGs sleep as
simulated workloads).

Rules, each reported as ``file:line: rule``:

sleep
    A call to ``time.sleep``, ``asyncio.sleep`` or a ``sleep`` imported from either.
    Waiting is ``tests.fixtures.waiting.wait_for`` (on a file, a record, a state,
    with a generous deadline), the one place allowed to sleep.  ``asyncio.sleep(0)``
    only yields to the event loop and is allowed.
elapsed
    An ``assert`` on elapsed wall-clock time: its test holds a subtraction with a
    clock reading (``time.monotonic/time/perf_counter/thread_time/process_time``,
    their ``_ns`` forms, ``datetime.now/utcnow``, or a name assigned from one in the
    same function) as an operand, or a name assigned from such a subtraction in the
    same function, or a name containing "elapsed".  A deadline check without a
    subtraction (``assert time.monotonic() < deadline``) is not elapsed time.
    Timings belong in benchmarks/.
marker
    A ``# timing-ok:`` comment without a reason.

Escape: ``# timing-ok: <reason>`` on the flagged line or the line just above it
(a workload's own loop shipped to a job, a double's poll interval).  Code in string
literals (scripts run by subprocesses) is not a call here, so it is never flagged.

Usage: python scripts/check_test_timing.py [root]; exit 1 on any finding.  The count
of escapes is printed at the end: keep it small.
"""

from __future__ import annotations

import ast
import io
import re
import sys
import tokenize
from pathlib import Path

ROOTS = ("tests/unit", "tests/integration", "tests/fixtures")
HELPER = "tests/fixtures/waiting.py"
CLOCKS = {
    ("time", name)
    for base in ("monotonic", "time", "perf_counter", "thread_time", "process_time")
    for name in (base, base + "_ns")
} | {("datetime", "now"), ("datetime", "utcnow")}
SLEEPS = {("time", "sleep"), ("asyncio", "sleep")}
MARKER = re.compile(r"#\s*timing-ok:(.*)")


def _markers(source: str) -> dict[int, str]:
    """Line -> the reason of its ``# timing-ok:`` comment (stripped, maybe empty)."""
    found = {}
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT and (m := MARKER.search(tok.string)):
            found[tok.start[0]] = m.group(1).strip()
    return found


class _Checker(ast.NodeVisitor):
    def __init__(self) -> None:
        self.names: dict[str, tuple[str, str]] = {}  # local name -> (module, attr)
        self.modules: dict[str, str] = {}  # local name -> module (import x as y)
        self.findings: list[tuple[int, str]] = []
        self.scopes: list[tuple[set[str], set[str]]] = [(set(), set())]  # clocks, spans

    # ---- what a name or a call stands for ---------------------------------------
    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            self.modules[alias.asname or alias.name] = alias.name

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        for alias in node.names:
            if node.module in ("time", "asyncio", "datetime"):
                self.names[alias.asname or alias.name] = (node.module, alias.name)
            if node.module == "datetime" and alias.name == "datetime":
                self.modules[alias.asname or alias.name] = "datetime"

    def _target(self, func: ast.expr) -> tuple[str, str] | None:
        if isinstance(func, ast.Name):
            return self.names.get(func.id)
        if isinstance(func, ast.Attribute):
            value = func.value
            if (
                isinstance(value, ast.Attribute)
                and isinstance(value.value, ast.Name)
                and (self.modules.get(value.value.id), value.attr) == ("datetime", "datetime")
            ):
                return ("datetime", func.attr)  # datetime.datetime.now
            if isinstance(value, ast.Name) and value.id in self.modules:
                return (self.modules[value.id], func.attr)
        return None

    def _is_clock(self, node: ast.expr) -> bool:
        if isinstance(node, ast.Call):
            return self._target(node.func) in CLOCKS
        return isinstance(node, ast.Name) and node.id in self.scopes[-1][0]

    def _is_span(self, node: ast.expr) -> bool:
        """A subtraction with a clock reading as an operand."""
        return (
            isinstance(node, ast.BinOp)
            and isinstance(node.op, ast.Sub)
            and (self._is_clock(node.left) or self._is_clock(node.right))
        )

    # ---- scopes: names assigned from a clock reading or an elapsed span ----------
    def _function(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        self.scopes.append((set(), set()))
        self.generic_visit(node)
        self.scopes.pop()

    visit_FunctionDef = visit_AsyncFunctionDef = _function

    def _assigned(self, targets: list[ast.expr], value: ast.expr | None) -> None:
        if value is None:
            return
        clocks, spans = self.scopes[-1]
        names = [t.id for t in targets if isinstance(t, ast.Name)]  # not obj.attr = ...
        if self._is_clock(value):
            clocks.update(names)
        if any(self._is_span(n) for n in ast.walk(value)):
            spans.update(names)

    def visit_Assign(self, node: ast.Assign) -> None:
        self._assigned(node.targets, node.value)
        self.generic_visit(node)

    def visit_AnnAssign(self, node: ast.AnnAssign) -> None:
        self._assigned([node.target], node.value)
        self.generic_visit(node)

    def visit_NamedExpr(self, node: ast.NamedExpr) -> None:
        self._assigned([node.target], node.value)
        self.generic_visit(node)

    # ---- the rules ----------------------------------------------------------------
    def visit_Call(self, node: ast.Call) -> None:
        if self._target(node.func) in SLEEPS:
            yields = (
                len(node.args) == 1
                and isinstance(node.args[0], ast.Constant)
                and node.args[0].value == 0
            )
            if not yields:
                self.findings.append((node.lineno, "sleep: wait on a state with wait_for"))
        self.generic_visit(node)

    def visit_Assert(self, node: ast.Assert) -> None:
        spans = self.scopes[-1][1]
        for sub in ast.walk(node.test):
            if (
                self._is_span(sub)
                or isinstance(sub, ast.Name)
                and (sub.id in spans or "elapsed" in sub.id.lower())
            ):
                self.findings.append((node.lineno, "elapsed: an assert on wall-clock time"))
                break
        self.generic_visit(node)


def check_source(source: str, path: str = "<source>") -> tuple[list[str], int]:
    """The findings (``path:line: rule``) left after the escapes, and the escapes used."""
    checker = _Checker()
    checker.visit(ast.parse(source, path))
    markers = _markers(source)
    problems, escapes = [], 0
    for line, reason in sorted(markers.items()):
        if not reason:
            problems.append(f"{path}:{line}: marker: '# timing-ok:' needs a reason")
    for line, rule in sorted(set(checker.findings)):
        if markers.get(line) or markers.get(line - 1):
            escapes += 1
        else:
            problems.append(f"{path}:{line}: {rule}")
    return problems, escapes


def check_tree(root: Path) -> tuple[list[str], int]:
    problems, escapes = [], 0
    for top in ROOTS:
        for file in sorted((root / top).rglob("*.py")):
            rel = file.relative_to(root).as_posix()
            found, used = check_source(file.read_text(), rel)
            if rel == HELPER:  # the one place that sleeps between looks
                found = [p for p in found if ": sleep:" not in p]
            problems += found
            escapes += used
    return problems, escapes


def main(argv: list[str]) -> int:
    root = Path(argv[1]) if len(argv) > 1 else Path(__file__).resolve().parents[1]
    problems, escapes = check_tree(root)
    for problem in problems:
        print(problem)
    print(f"{len(problems)} finding(s), {escapes} escape(s) marked '# timing-ok:'")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
