"""F5 of the structure (DESIGN §13): layers only point down, and no module imports itself back.

Every import in the product's code (at module level or inside a function: a lazy import is
still an arrow) is read with ``ast`` and checked against the layer order below, top to
bottom. A module may import its own layer or any layer under it; a cycle among modules of
one layer fails too.
"""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# Top first. Longest prefix wins, so a subpackage may sit apart from its parent.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("controlplane.main", "controlplane.demo", "controlplane.cli", "agent"),
    ("controlplane.server",),
    ("controlplane.app",),
    ("controlplane.api", "controlplane.console"),
    ("controlplane.reconciler", "controlplane.metrics"),
    ("controlplane.runtime",),
    ("controlplane.reads",),
    ("controlplane.services",),
    ("controlplane.capacity",),
    ("controlplane.iam",),
    ("controlplane.storage",),
    ("controlplane.config", "controlplane.overload"),
    ("shared",),
)
PACKAGES = ("controlplane", "agent", "shared")


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def layer_of(module: str) -> int:
    best, rank = -1, -1
    for index, prefixes in enumerate(LAYERS):
        for prefix in prefixes:
            if (module == prefix or module.startswith(prefix + ".")) and len(prefix) > best:
                best, rank = len(prefix), index
    assert rank >= 0, f"{module} belongs to no layer: place it in LAYERS"
    return rank


def imports_of(path: Path, module: str) -> set[str]:
    """The product modules ``path`` imports (``from x import y`` counts ``x.y`` when that is a
    module, else ``x``)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    found: set[str] = set()
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            found.add(base)
            found.update(f"{base}.{alias.name}" for alias in node.names)
    return {name for name in found if name.split(".")[0] in PACKAGES}


def graph() -> dict[str, set[str]]:
    paths = [p for package in PACKAGES for p in (ROOT / package).rglob("*.py")]
    modules = {module_name(p): p for p in paths}
    edges: dict[str, set[str]] = {}
    for name, path in modules.items():
        edges[name] = {
            target
            for target in imports_of(path, name)
            if target in modules and target != name and not name.startswith(target + ".")
        }
    return edges


def test_f5_every_import_points_down_the_layers() -> None:
    """No module imports a layer above its own (e.g. the core importing metrics or the app)."""
    upward = sorted(
        f"{source} ({LAYERS[layer_of(source)][0]}) imports {target} ({LAYERS[layer_of(target)][0]})"
        for source, targets in graph().items()
        for target in targets
        if layer_of(target) < layer_of(source)
    )
    assert upward == []


def test_f5_no_import_cycle() -> None:
    """No chain of imports leads from a module back to itself."""
    edges = graph()
    state: dict[str, int] = {}  # 1 on the path, 2 done
    cycles: list[list[str]] = []

    def visit(node: str, path: list[str]) -> None:
        state[node] = 1
        for target in sorted(edges[node]):
            if state.get(target) == 1:
                cycles.append([*path[path.index(target) :], target])
            elif target not in state:
                visit(target, [*path, target])
        state[node] = 2

    for start in sorted(edges):
        if start not in state:
            visit(start, [start])
    assert cycles == []


def test_f5_the_check_sees_an_upward_import() -> None:
    """The layer order refuses what it should: storage may not import services or the app."""
    assert layer_of("controlplane.services.pools") < layer_of("controlplane.storage.pools")
    assert layer_of("controlplane.app") < layer_of("controlplane.runtime")
    assert layer_of("controlplane.metrics") < layer_of("controlplane.capacity.bookings")
    assert layer_of("shared.schemas") == len(LAYERS) - 1
