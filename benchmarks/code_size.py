"""Logical lines of a Python tree: non-blank, non-comment lines outside docstrings (issue 31 item 8).

    python benchmarks/code_size.py dattn_cli            # total and per top-level package
    python benchmarks/code_size.py dattn_cli --json -

Count the tree after `ruff format` (both sides of a comparison formatted alike), so that layout alone does not
move the figure.
"""

from __future__ import annotations

import argparse
import ast
import io
import json
import sys
import tokenize
from collections import Counter
from pathlib import Path


def docstring_lines(tree: ast.AST) -> set[int]:
    """Line numbers covered by module, class and function docstrings."""
    lines: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = getattr(node, "body", [])
            if body and isinstance(body[0], ast.Expr) and isinstance(getattr(body[0], "value", None), ast.Constant):
                if isinstance(body[0].value.value, str):
                    lines.update(range(body[0].lineno, body[0].end_lineno + 1))
    return lines


def logical_lines(source: str) -> int:
    """Lines holding at least one code token that is not part of a docstring."""
    skip = docstring_lines(ast.parse(source))
    code: set[int] = set()
    ignored = {tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT, tokenize.ENDMARKER}
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type not in ignored:
            code.update(line for line in range(tok.start[0], tok.end[0] + 1) if line not in skip)
    return len(code)


def count(root: Path) -> Counter:
    per_package: Counter = Counter()
    for file in sorted(root.rglob("*.py")):
        if "__pycache__" in file.parts:
            continue
        parts = file.relative_to(root).parts
        per_package[parts[0] if len(parts) > 1 else "(top)"] += logical_lines(file.read_text(encoding="utf-8"))
    return per_package


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("root", type=Path)
    parser.add_argument("--json", help="write {package: lines, total: lines} to FILE, or - for stdout")
    args = parser.parse_args()
    per_package = count(args.root)
    result = dict(sorted(per_package.items())) | {"total": sum(per_package.values())}
    if args.json:
        text = json.dumps(result, indent=2)
        sys.stdout.write(text + "\n") if args.json == "-" else Path(args.json).write_text(text + "\n")
    else:
        for name, lines in result.items():
            print(f"{name:12s} {lines:6d}")


if __name__ == "__main__":
    main()
