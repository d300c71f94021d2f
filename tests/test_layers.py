"""The import graph has no upward edge and no cycle, function-local imports included.

The layers, bottom to top, are drawn in docs/architecture.md ("Layers"). A module may import
modules of its own layer or of lower layers; a layer is a module-name prefix (the longest
matching prefix wins, so ``feedline._ray.map`` and ``feedline._ray.train`` sit apart).
"""

from __future__ import annotations

import ast
import functools
from collections.abc import Iterator
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src" / "feedline"

LAYERS: list[list[str]] = [
    ["feedline.errors"],
    ["feedline._core", "feedline._state"],
    ["feedline._spec", "feedline._tokenize"],
    ["feedline._sources"],
    ["feedline._tasks"],
    ["feedline._batching"],
    ["feedline._partitions"],
    ["feedline._pipeline"],
    ["feedline._records"],
    ["feedline._loader"],
    ["feedline._service"],   # above the loader, which reaches the client only through its transport registry
    ["feedline._adapters", "feedline._ray", "feedline._tools", "feedline._testing"],
    ["feedline._demo"],
    ["feedline._hf_datasets"],
    # the public modules (re-exports of the rooms below them), the package root and the command line
    ["feedline.tasks", "feedline.torch", "feedline.jax", "feedline.ray", "feedline.service", "feedline.tools", "feedline.testing",
     "feedline._cli", "feedline.__main__", "feedline"],
]


def layer_of(module: str) -> int:
    best, level = "", -1
    for i, prefixes in enumerate(LAYERS):
        for p in prefixes:
            if (module == p or module.startswith(p + ".")) and len(p) > len(best):
                best, level = p, i
    assert level >= 0, f"{module} is in no layer; add it to LAYERS and to docs/architecture.md"
    return level


def module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


MODULES = {module_name(p): p for p in sorted(SRC.rglob("*.py"))}


def imports(module: str) -> list[tuple[str, int]]:
    """``(imported feedline module, line)`` for every import in ``module``, at any depth (parsed once)."""
    return _imports(module)


@functools.cache
def _imports(module: str) -> list[tuple[str, int]]:
    return list(_walk_imports(module))


def _walk_imports(module: str) -> Iterator[tuple[str, int]]:
    path = MODULES[module]
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name.split(".")[0] == "feedline":
                    yield a.name, node.lineno
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join([*up, *([node.module] if node.module else [])])
            if base.split(".")[0] != "feedline":
                continue
            for a in node.names:  # `from pkg import sub` imports the submodule pkg.sub
                sub = f"{base}.{a.name}"
                yield (sub if sub in MODULES else base), node.lineno


@functools.cache
def graph() -> dict[str, list[str]]:
    """Each module's feedline imports; built when a test asks (every test process collects this file)."""
    return {m: sorted({t for t, _ in imports(m) if t != m}) for m in MODULES}


def test_every_import_goes_to_the_same_or_a_lower_layer() -> None:
    upward = []
    for m in MODULES:
        for target, line in imports(m):
            if target != m and layer_of(target) > layer_of(m):
                upward.append(f"{MODULES[m].relative_to(SRC.parent)}:{line}: {m} (layer {layer_of(m)}) imports "
                              f"{target} (layer {layer_of(target)})")
    assert not upward, "upward imports:\n" + "\n".join(upward)


def test_the_module_graph_has_no_cycle() -> None:
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    cycles: list[list[str]] = []

    def visit(v: str) -> None:  # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph().get(v, []):
            if w not in MODULES:
                continue
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                cycles.append(sorted(comp))

    for m in MODULES:
        if m not in index:
            visit(m)
    assert not cycles, f"import cycles: {cycles}"


def test_the_layers_in_the_docs_match_this_test() -> None:
    doc = (SRC.parents[1] / "docs" / "architecture.md").read_text()
    for prefixes in LAYERS:
        for p in prefixes:
            assert f"`{p}`" in doc or f"`{p.removeprefix('feedline.')}`" in doc, f"{p} is not in docs/architecture.md's layers"
