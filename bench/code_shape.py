"""Module and function sizes over ``src/feedline``, and the package import graph.

    python bench/code_shape.py            # summary table
    python bench/code_shape.py --graph    # plus package -> package import edges (function-local imports included)

Sizes are physical lines. The import graph is read with ``ast`` (no import happens), so
imports inside functions count like module-level ones.
"""

from __future__ import annotations

import argparse
import ast
import statistics
from collections import defaultdict
from pathlib import Path

SRC = Path(__file__).resolve().parent.parent / "src" / "feedline"


def module_name(path: Path) -> str:
    rel = path.relative_to(SRC.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports_of(tree: ast.AST, module: str, is_package: bool) -> set[str]:
    """Every feedline module ``tree`` imports, at any depth."""
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names if a.name.startswith("feedline"))
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".") if is_package else module.split(".")[:-1]
                base = base[: len(base) - (node.level - 1)]
                name = ".".join(base + ([node.module] if node.module else []))
            else:
                name = node.module or ""
            if name == "feedline":  # `from feedline import errors` imports the submodule
                out.update(f"feedline.{a.name}" if (SRC / f"{a.name}.py").exists() else name for a in node.names)
            elif name.startswith("feedline"):
                out.add(name)
    return out


def package_of(module: str) -> str:
    parts = module.split(".")
    return ".".join(parts[:2]) if len(parts) > 1 else parts[0]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--graph", action="store_true", help="print package import edges")
    args = ap.parse_args()
    sizes, funcs, edges = [], [], defaultdict(set)
    for path in sorted(SRC.rglob("*.py")):
        text = path.read_text()
        tree = ast.parse(text)
        mod = module_name(path)
        sizes.append(len(text.splitlines()))
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                funcs.append(node.end_lineno - node.lineno + 1)  # type: ignore[operator]
        for target in imports_of(tree, mod, path.name == "__init__.py"):
            a, b = package_of(mod), package_of(target)
            if a != b:
                edges[a].add(b)
    q = statistics.quantiles
    print(f"modules {len(sizes)}  lines {sum(sizes)}  median {statistics.median(sizes):.0f}  "
          f"p90 {q(sizes, n=10)[-1]:.0f}  max {max(sizes)}  >400: {sum(s > 400 for s in sizes)}")
    print(f"functions {len(funcs)}  median {statistics.median(funcs):.0f}  p90 {q(funcs, n=10)[-1]:.0f}  "
          f"max {max(funcs)}  >50 lines: {sum(f > 50 for f in funcs)}")
    if args.graph:
        for a in sorted(edges):
            print(f"  {a} -> {', '.join(sorted(edges[a]))}")


if __name__ == "__main__":
    main()
