"""The fast inner loop, `python -m pytest -m "not slow"`: `slow` marks a test that takes over 5 s on 2 cores
(`--durations`), with `@pytest.mark.slow` or, for a file of such tests, `pytestmark = pytest.mark.slow`.

* the fast set holds at least FAST_SHARE of the tests (counted by pytest's own collection);
* it touches every module of dattn_cli. The rule, checked statically: every dattn_cli module is reached from
  the imports of a fast test (any import in a test file, except in a file marked slow as a whole and in a test
  function or class marked slow), then through dattn_cli's own imports (tests/test_structure.py's graph). A
  string that names a module counts as importing it, and one naming a package with a __main__ as running that
  (`python -m dattn_cli`, a forkserver's preload list).
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.test_structure import PACKAGE, ROOT, collect_imports, find_modules, from_import_targets, import_targets

FAST_SHARE = 0.80
TESTS = ROOT / "tests"


def is_slow_mark(node: ast.expr) -> bool:
    """`pytest.mark.slow` or `mark.slow` (a list of marks holding it counts too)."""
    if isinstance(node, (ast.List, ast.Tuple)):
        return any(is_slow_mark(e) for e in node.elts)
    return isinstance(node, ast.Attribute) and node.attr == "slow"


def slow_file(tree: ast.Module) -> bool:
    for node in tree.body:
        targets = node.targets if isinstance(node, ast.Assign) else []
        if any(isinstance(t, ast.Name) and t.id == "pytestmark" for t in targets) and is_slow_mark(node.value):
            return True
    return False


def named_modules(value: object, modules: dict[str, Path]) -> set[str]:
    """A string naming a module imports it (importlib, a forkserver's preload list); naming a package with a
    __main__ runs that too (`python -m dattn_cli`, runpy)."""
    if not isinstance(value, str) or value not in modules:
        return set()
    return {value} | ({f"{value}.__main__"} & modules.keys())


def fast_imports(tree: ast.Module, modules: dict[str, Path]) -> set[str]:
    """dattn_cli modules a test file imports outside the tests and classes marked slow."""
    found: set[str] = set()
    stack: list[ast.AST] = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and any(
            is_slow_mark(d) for d in node.decorator_list
        ):
            continue
        if isinstance(node, ast.Import):
            found.update(import_targets(node))
        elif isinstance(node, ast.ImportFrom) and not node.level:
            found.update(from_import_targets("tests", node, modules))
        elif isinstance(node, ast.Constant):
            found.update(named_modules(node.value, modules))
        stack.extend(ast.iter_child_nodes(node))
    return found


def unreached_modules(root: Path = ROOT) -> list[str]:
    modules = find_modules(root)
    graph: dict[str, set[str]] = {}
    for imp in collect_imports(root):
        graph.setdefault(imp.source, set()).add(imp.target)
    for name, file in modules.items():  # modules named by strings (runtime/launch.py's forkserver preload)
        for node in ast.walk(ast.parse(file.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Constant):
                graph.setdefault(name, set()).update(named_modules(node.value, modules) - {name})
    reached: set[str] = set()
    for file in sorted((root / "tests").rglob("*.py")):
        tree = ast.parse(file.read_text(encoding="utf-8"), filename=str(file))
        if not slow_file(tree):
            reached |= fast_imports(tree, modules)
    frontier = list(reached)
    while frontier:
        module = frontier.pop()
        parts = module.split(".")
        parents = {".".join(parts[:i]) for i in range(1, len(parts))}  # importing a.b.c runs a and a.b
        for nxt in (graph.get(module, set()) | parents) - reached:
            reached.add(nxt)
            frontier.append(nxt)
    return sorted(name for name in modules if name not in reached)


def test_every_module_is_imported_by_a_fast_test() -> None:
    missing = unreached_modules()
    assert not missing, f"{PACKAGE} modules no fast test reaches (import them from a test not marked slow): {missing}"


@pytest.mark.slow  # a collection of the whole suite
def test_the_fast_set_holds_most_of_the_tests() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-m", "not slow", "-p", "no:cacheprovider"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    found = re.search(r"(\d+)/(\d+) tests collected \((\d+) deselected\)", done.stdout)
    assert found, done.stdout[-2000:] + done.stderr[-2000:]
    fast, total = int(found[1]), int(found[2])
    assert fast >= FAST_SHARE * total, f"the fast set holds {fast} of {total} tests, under {FAST_SHARE:.0%}"


def test_the_marker_rules_see_file_and_test_marks(tmp_path: Path) -> None:
    tree = ast.parse(
        "import pytest\nfrom dattn_cli.plan import memory\n"
        "@pytest.mark.slow\ndef test_a():\n    from dattn_cli.bench import sweep\n"
        "def test_b():\n    import dattn_cli.compare.stats\n"
    )
    modules = find_modules(ROOT)
    assert not slow_file(tree)
    assert fast_imports(tree, modules) == {f"{PACKAGE}.plan.memory", f"{PACKAGE}.compare.stats"}
    assert slow_file(ast.parse("import pytest\npytestmark = [pytest.mark.slow, pytest.mark.skipif(True, reason='')]\n"))
