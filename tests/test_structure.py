"""Structure rules for the dattn_cli package, checked statically with `ast` (nothing is imported).

* no import cycle between modules;
* the sibling packages verify, bench, profile and plan do not import one another;
* inside dattn_cli.plan, imports flow one way along memory <- time <- layers <- solve;
* no module over MAX_MODULE_LINES lines, no function over MAX_FUNCTION_LINES lines;
* docstrings name only files that exist (docstring_paths states the rule);
* pyproject.toml lists every package of dattn_cli (the list is explicit because profiles/ is mapped into it).

Import graph conventions: `import dattn_cli.a` and `from dattn_cli import a` (when a is a package) mean the
package's `__init__`; `from pkg import x` means the submodule pkg.x when x is one, else pkg itself; a module
that does not exist (yet) is still a node, under the name imported. Imports inside
functions count (they are still dependencies); imports under `if TYPE_CHECKING:` do not. Implicit imports of
parent packages (importing dattn_cli.a.b runs dattn_cli/a/__init__) are not edges, and a module importing
itself (`from . import name` in an __init__) is not a cycle. Imports through importlib strings are not seen.
Every failure lists all offenders, so the whole job is visible at once.
"""

from __future__ import annotations

import ast
import re
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = "dattn_cli"

MAX_MODULE_LINES = 400
MAX_FUNCTION_LINES = 60

# Files ("dattn_cli/x.py") or functions ("dattn_cli/x.py::name") exempt from the size limits. Only data
# tables qualify: a module or function that is mostly a literal table (dicts/lists of constants, e.g. a
# registry of figures with their sources). Logic does not; split it instead. Keep this small.
SIZE_ALLOWLIST: frozenset[str] = frozenset()

SIBLING_PACKAGES = ("verify", "bench", "profile", "plan", "compare")
REPOSITORY_FOLDERS = ("dattn_cli", "tests", "docs", "benchmarks", "profiles", "model_presets")

# Inside dattn_cli.plan: a module may import only modules to its left in this chain.
PLAN_CHAIN = ("memory", "time", "layers", "solve")


@dataclass(frozen=True)
class Import:
    """One import statement's dependency on one dattn_cli module."""

    source: str  # importing module, e.g. "dattn_cli.plan.layers"
    target: str  # imported module, resolved
    path: str  # file of the importing module, relative to the repository root
    line: int
    text: str  # the statement as written

    def where(self) -> str:
        return f"{self.path}:{self.line}"


# --- discovering modules ---------------------------------------------------------------------------------


def module_name(file: Path, root: Path) -> str:
    """dattn_cli/a/b.py -> dattn_cli.a.b; dattn_cli/a/__init__.py -> dattn_cli.a."""
    parts = list(file.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def find_modules(root: Path, package: str = PACKAGE) -> dict[str, Path]:
    """Every module of `package` under `root`, by dotted name."""
    files = sorted((root / package).rglob("*.py"))
    return {module_name(f, root): f for f in files if "__pycache__" not in f.parts}


def is_package(name: str, modules: Mapping[str, Path]) -> bool:
    return modules[name].name == "__init__.py"


# --- resolving imports -----------------------------------------------------------------------------------


def relative_base(source: str, level: int, modules: Mapping[str, Path]) -> str:
    """The package that `from <level dots> import ...` in module `source` starts from."""
    package = source if is_package(source, modules) else source.rpartition(".")[0]
    for _ in range(level - 1):
        package = package.rpartition(".")[0]
    return package


def from_import_targets(source: str, node: ast.ImportFrom, modules: Mapping[str, Path]) -> list[str]:
    """Modules a `from X import a, b` depends on: X.a when that is a submodule, else X."""
    if node.level:
        base = relative_base(source, node.level, modules)
        origin = f"{base}.{node.module}" if node.module else base
    else:
        origin = node.module or ""
    if origin.split(".")[0] != PACKAGE:
        return []
    submodules = (f"{origin}.{alias.name}" for alias in node.names)
    return [name if name in modules else origin for name in submodules]


def import_targets(node: ast.Import) -> list[str]:
    return [alias.name for alias in node.names if alias.name.split(".")[0] == PACKAGE]


def is_type_checking_block(node: ast.AST) -> bool:
    if not isinstance(node, ast.If):
        return False
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def import_nodes(tree: ast.AST) -> Iterable[ast.Import | ast.ImportFrom]:
    """Every import statement at any depth (functions included), skipping `if TYPE_CHECKING:` bodies."""
    stack: list[ast.AST] = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        children = list(ast.iter_child_nodes(node))
        if is_type_checking_block(node):
            skipped = {id(statement) for statement in node.body}  # keep the test and the else branch
            children = [c for c in children if id(c) not in skipped]
        stack.extend(children)


def module_imports(source: str, file: Path, modules: Mapping[str, Path], root: Path) -> list[Import]:
    tree = ast.parse(file.read_text(encoding="utf-8"), filename=str(file))
    rel = file.relative_to(root).as_posix()
    found = []
    for node in import_nodes(tree):
        if isinstance(node, ast.Import):
            targets = import_targets(node)
        else:
            targets = from_import_targets(source, node, modules)
        text = ast.unparse(node)
        found += [Import(source, t, rel, node.lineno, text) for t in targets if t != source]
    return sorted(set(found), key=lambda i: (i.path, i.line, i.target))


def collect_imports(root: Path = ROOT, package: str = PACKAGE) -> list[Import]:
    modules = find_modules(root, package)
    return [imp for name, file in modules.items() for imp in module_imports(name, file, modules, root)]


def import_graph(imports: Iterable[Import]) -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    for imp in imports:
        graph.setdefault(imp.source, set()).add(imp.target)
        graph.setdefault(imp.target, set())
    return graph


# --- cycles ----------------------------------------------------------------------------------------------


def strongly_connected(graph: Mapping[str, Iterable[str]]) -> list[list[str]]:
    """Tarjan's algorithm (iterative): the components with more than one node, each sorted, in sorted order."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    components: list[list[str]] = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph.get(start, ()))))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is None:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        components.append(sorted(component))
            elif child not in index:
                index[child] = low[child] = len(index)
                stack.append(child)
                on_stack.add(child)
                work.append((child, iter(sorted(graph.get(child, ())))))
            elif child in on_stack:
                low[node] = min(low[node], index[child])
    return sorted(components)


def shortest_path(start: str, goal: str, graph: Mapping[str, Iterable[str]], allowed: set[str]) -> list[str]:
    """Breadth-first path start -> ... -> goal through `allowed` nodes only (both ends included)."""
    parents: dict[str, str] = {start: start}
    frontier = [start]
    while frontier and goal not in parents:
        following = []
        for node in frontier:
            for child in sorted(set(graph.get(node, ())) & allowed):
                if child not in parents:
                    parents[child] = node
                    following.append(child)
        frontier = following
    if goal not in parents:
        raise AssertionError(f"no path {start} -> {goal}")
    path = [goal]
    while path[-1] != start:
        path.append(parents[path[-1]])
    return path[::-1]


def canonical(cycle: list[str]) -> tuple[str, ...]:
    """["b", "c", "a", "b"] -> ("a", "b", "c", "a"): the same cycle, started at its smallest node."""
    ring = cycle[:-1]
    first = ring.index(min(ring))
    ring = ring[first:] + ring[:first]
    return (*ring, ring[0])


def find_cycles(graph: Mapping[str, Iterable[str]]) -> list[list[str]]:
    """Cycles covering every edge that lies on a cycle: for each such edge u -> v, u -> v + shortest v -> u.

    Each cycle is written ["a", "b", "a"] for a -> b -> a, starts at its smallest node, and appears once.
    """
    cycles: set[tuple[str, ...]] = set()
    for component in strongly_connected(graph):
        members = set(component)
        for source in component:
            for target in sorted(set(graph.get(source, ())) & members):
                cycles.add(canonical([source, *shortest_path(target, source, graph, members)]))
    return [list(c) for c in sorted(cycles)]


def describe_cycles(cycles: list[list[str]], imports: Iterable[Import]) -> str:
    edges = {(a, b) for cycle in cycles for a, b in zip(cycle, cycle[1:])}
    lines = ["cycle: " + " -> ".join(cycle) for cycle in cycles]
    lines.append("imports on these cycles:")
    lines += [describe(i) for i in imports if (i.source, i.target) in edges]
    return "\n".join(lines)


# --- layering rules --------------------------------------------------------------------------------------


def top_package(module: str, packages: Iterable[str], parent: str = PACKAGE) -> str | None:
    """Which of parent.<p> (for p in packages) contains `module`, matching whole dotted components."""
    for name in packages:
        full = f"{parent}.{name}"
        if module == full or module.startswith(full + "."):
            return name
    return None


def sibling_violations(imports: Iterable[Import], siblings: Iterable[str] = SIBLING_PACKAGES) -> list[Import]:
    siblings = tuple(siblings)
    bad = []
    for imp in imports:
        source, target = top_package(imp.source, siblings), top_package(imp.target, siblings)
        if source and target and source != target:
            bad.append(imp)
    return bad


def chain_violations(imports: Iterable[Import], package: str, chain: tuple[str, ...]) -> list[Import]:
    """Imports inside `package` that go right (or sideways) along `chain`; modules off the chain are free."""
    bad = []
    for imp in imports:
        source = top_package(imp.source, chain, package)
        target = top_package(imp.target, chain, package)
        if source and target and source != target and chain.index(target) > chain.index(source):
            bad.append(imp)
    return bad


def describe(imp: Import) -> str:
    return f"    {imp.where()} {imp.source} -> {imp.target}: {imp.text}"


# --- sizes -----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Oversize:
    path: str
    line: int
    name: str
    length: int

    def __str__(self) -> str:
        return f"    {self.path}:{self.line} {self.name} {self.length} lines"


def oversized_modules(root: Path = ROOT, limit: int = MAX_MODULE_LINES) -> list[Oversize]:
    found = []
    for name, file in find_modules(root).items():
        rel = file.relative_to(root).as_posix()
        length = len(file.read_text(encoding="utf-8").splitlines())
        if length > limit and rel not in SIZE_ALLOWLIST:
            found.append(Oversize(rel, 1, name, length))
    return found


def oversized_functions(root: Path = ROOT, limit: int = MAX_FUNCTION_LINES) -> list[Oversize]:
    found = []
    for file in find_modules(root).values():
        rel = file.relative_to(root).as_posix()
        for node in ast.walk(ast.parse(file.read_text(encoding="utf-8"), filename=str(file))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                length = node.end_lineno - node.lineno + 1
                if length > limit and f"{rel}::{node.name}" not in SIZE_ALLOWLIST:
                    found.append(Oversize(rel, node.lineno, node.name, length))
    return sorted(found, key=lambda o: (o.path, o.line))


# --- docstrings and packaging ----------------------------------------------------------------------------

PATH_IN_TEXT = re.compile(r"(?<![\w./-])((?:\w+/)*\w+\.(?:py|yaml|md))\b")


def docstrings(tree: ast.AST) -> Iterable[str]:
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            yield ast.get_docstring(node, clean=False) or ""


def missing_docstring_paths(root: Path = ROOT, package: str = PACKAGE) -> list[str]:
    """File names in dattn_cli's docstrings that do not exist. A name whose first folder is a subpackage of
    dattn_cli (bench/point.py) is looked up under dattn_cli/; one under a repository folder (tests/, docs/,
    benchmarks/, profiles/, dattn_cli/) at the repository root; a bare module name (point.py) in the module's
    own package or anywhere in dattn_cli. Other paths (torch/optim/optimizer.py) are another project's."""
    subpackages = {p.name for p in (root / package).iterdir() if (p / "__init__.py").is_file()}
    everywhere = {f.name for f in (root / package).rglob("*.py")}
    found = []
    for file in find_modules(root, package).values():
        rel = file.relative_to(root).as_posix()
        for text in docstrings(ast.parse(file.read_text(encoding="utf-8"), filename=str(file))):
            for path in PATH_IN_TEXT.findall(text):
                first = path.split("/")[0]
                if first in subpackages:
                    ok = (root / package / path).is_file()
                elif first in REPOSITORY_FOLDERS:
                    ok = (root / path).is_file()
                elif "/" not in path and path.endswith(".py"):
                    ok = (file.parent / path).is_file() or path in everywhere
                else:
                    continue
                if not ok:
                    found.append(f"    {rel}: {path}")
    return sorted(set(found))


def test_docstrings_name_existing_files() -> None:
    fail_listing("docstrings naming files that do not exist", missing_docstring_paths())


def test_pyproject_lists_every_package() -> None:
    tomllib = pytest.importorskip("tomllib") if sys.version_info >= (3, 11) else pytest.importorskip("tomli")
    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    folders = {module_name(f, ROOT) for f in (ROOT / PACKAGE).rglob("__init__.py") if "__pycache__" not in f.parts}
    folders.add(f"{PACKAGE}.profiles")  # profiles/ at the repository root, mapped by package-dir
    folders.add(f"{PACKAGE}.model_presets")  # model_presets/ likewise
    assert listed == folders, (
        f"pyproject.toml [tool.setuptools] packages: missing {folders - listed}, stale {listed - folders}"
    )


# --- the rules on the real package -----------------------------------------------------------------------


def fail_listing(title: str, offenders: Iterable[object]) -> None:
    """Fail with a title and one offender per line, or pass when there are none."""
    lines = [str(o) for o in offenders]
    if lines:
        pytest.fail(f"{title}:\n" + "\n".join(lines), pytrace=False)


def test_no_import_cycles() -> None:
    imports = collect_imports()
    cycles = find_cycles(import_graph(imports))
    if cycles:
        pytest.fail(f"{len(cycles)} import cycle(s):\n" + describe_cycles(cycles, imports), pytrace=False)


def test_sibling_packages_do_not_import_each_other() -> None:
    bad = sibling_violations(collect_imports())
    fail_listing(f"{len(bad)} import(s) between the sibling packages {', '.join(SIBLING_PACKAGES)}", map(describe, bad))


def test_plan_imports_flow_one_way() -> None:
    bad = chain_violations(collect_imports(), f"{PACKAGE}.plan", PLAN_CHAIN)
    title = f"{len(bad)} import(s) against the plan chain {' <- '.join(PLAN_CHAIN)} (import only to the left)"
    fail_listing(title, map(describe, bad))


def test_no_module_over_the_line_limit() -> None:
    bad = oversized_modules()
    fail_listing(f"{len(bad)} module(s) over {MAX_MODULE_LINES} lines", bad)


def test_no_function_over_the_line_limit() -> None:
    bad = oversized_functions()
    fail_listing(f"{len(bad)} function(s) over {MAX_FUNCTION_LINES} lines", bad)


def test_size_allowlist_entries_exist() -> None:
    stale = [entry for entry in sorted(SIZE_ALLOWLIST) if not (ROOT / entry.split("::")[0]).is_file()]
    fail_listing("SIZE_ALLOWLIST names missing files", stale)


# --- the checkers can fail -------------------------------------------------------------------------------


def test_cycle_finder_finds_synthetic_cycles() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": set(), "e": {"d"}}
    assert find_cycles(graph) == [["a", "b", "c", "a"]]
    assert find_cycles({"a": {"b"}, "b": {"c"}, "c": set()}) == []
    assert find_cycles({"x": {"y"}, "y": {"x"}, "p": {"q"}, "q": {"r"}, "r": {"p"}}) == [
        ["p", "q", "r", "p"],
        ["x", "y", "x"],
    ]
    # One component, two cycles through b: both are listed, so no edge of the tangle is hidden.
    assert find_cycles({"a": {"b"}, "b": {"a", "c"}, "c": {"a"}}) == [["a", "b", "a"], ["a", "b", "c", "a"]]


def write_package(root: Path, files: Mapping[str, str]) -> None:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")


def test_sibling_check_flags_a_synthetic_cross_import(tmp_path: Path) -> None:
    write_package(
        tmp_path,
        {
            f"{PACKAGE}/__init__.py": "",
            f"{PACKAGE}/render.py": "",
            f"{PACKAGE}/profiles.py": "",  # not the sibling `profile`
            f"{PACKAGE}/plan/__init__.py": "from . import memory\n",
            f"{PACKAGE}/plan/memory.py": "from .. import render\nfrom dattn_cli import profiles\n",
            f"{PACKAGE}/plan/solve.py": "def f():\n    from ..bench import sweep\n",  # inside a function: counts
            f"{PACKAGE}/plan/time.py": "from . import memory, model\nfrom .solve import f\n",  # solve: right of time
            f"{PACKAGE}/plan/model.py": "from .solve import f\n",  # off the chain: free
            f"{PACKAGE}/bench/__init__.py": "",
            f"{PACKAGE}/bench/sweep.py": (
                "from typing import TYPE_CHECKING\n"
                "if TYPE_CHECKING:\n    from dattn_cli.verify import run\n"  # ignored
                "import dattn_cli.plan.memory as m\n"
            ),
            f"{PACKAGE}/verify/__init__.py": "",
            f"{PACKAGE}/verify/run.py": "",
        },
    )
    bad = sibling_violations(collect_imports(tmp_path))
    assert [(i.path, i.line, i.target) for i in bad] == [
        (f"{PACKAGE}/bench/sweep.py", 4, f"{PACKAGE}.plan.memory"),
        (f"{PACKAGE}/plan/solve.py", 2, f"{PACKAGE}.bench.sweep"),
    ]
    wrong_way = chain_violations(collect_imports(tmp_path), f"{PACKAGE}.plan", PLAN_CHAIN)
    assert [(i.path, i.line, i.target) for i in wrong_way] == [(f"{PACKAGE}/plan/time.py", 2, f"{PACKAGE}.plan.solve")]


def test_docstring_path_check_flags_a_missing_file(tmp_path: Path) -> None:
    write_package(
        tmp_path,
        {
            f"{PACKAGE}/__init__.py": "",
            f"{PACKAGE}/bench/__init__.py": "",
            f"{PACKAGE}/bench/point.py": '"""Uses bench/point.py, point.py and torch/optim/optimizer.py."""\n',
            f"{PACKAGE}/bench/sweep.py": (
                '"""Reads bench/sweep_config.py and docs/design.md."""\n\ndef f():\n    """gone.py"""\n'
            ),
        },
    )
    assert missing_docstring_paths(tmp_path) == [
        f"    {PACKAGE}/bench/sweep.py: bench/sweep_config.py",
        f"    {PACKAGE}/bench/sweep.py: docs/design.md",
        f"    {PACKAGE}/bench/sweep.py: gone.py",
    ]
