"""The package's import direction, read from the source (every import, at module level or inside a function).

mgrpo_algo's subpackages are layers; a module imports from its own subpackage or from a lower layer,
never from a higher one or sideways, and no two modules import each other, even through others.
Backends that a lower module selects (Redis store, Ray placement, role servers) are named in
registries as "module:attr" strings and imported on first use; the strings must resolve.
Across packages: the env never imports torch or the algorithm, the algorithm never parses HTML, and
the tools know neither the env nor the algorithm.
"""

from __future__ import annotations

import ast
from pathlib import Path
from pkgutil import resolve_name

import pytest

ROOT = Path(__file__).resolve().parents[1]
LAYERS = {"core": 0, "policies": 1, "distributed": 1, "learning": 2, "training": 3, "experiments": 4, "config_doc": 4, "cli": 5, "__main__": 6}  # __main__: python -m mgrpo_algo, the cli


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path, modules: set[str]) -> set[str]:
    """The modules of ``modules`` that ``path`` imports (relative imports resolved)."""
    name = _module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join(anchor + ([base] if base else []))
            # "from pkg import module" imports the module; "from module import name" the module
            subs = [f"{base}.{alias.name}" for alias in node.names]
            targets = [t for t in subs if t in modules] or [base]
        else:
            continue
        for target in targets:
            while target and target not in modules:  # "a.b.c" where a.b is the module
                target = target.rpartition(".")[0]
            if target and target != name:
                found.add(target)
    return found


def _graph(package: str) -> dict[str, set[str]]:
    paths = {_module_name(p): p for p in (ROOT / package).rglob("*.py")}
    modules = set(paths)
    return {name: _imports(path, modules) for name, path in paths.items()}


def _layer(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else None  # None: the package's own __init__


def test_layers_import_only_downwards():
    wrong = []
    for module, targets in _graph("mgrpo_algo").items():
        source = _layer(module)
        if source is None:
            continue
        for target in targets:
            layer = _layer(target)
            if layer is None:
                wrong.append(f"{module} -> {target} (the package root)")
            elif layer != source and LAYERS[layer] >= LAYERS[source]:
                wrong.append(f"{module} ({source}) -> {target} ({layer})")
    assert not wrong, "imports against the layers:\n" + "\n".join(sorted(wrong))


def test_every_module_is_in_a_layer():
    layers = {_layer(m) for m in _graph("mgrpo_algo")} - {None}
    assert layers == set(LAYERS)


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    cycles, state = [], {}

    def visit(node: str, path: list[str]) -> None:
        state[node] = "open"
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == "open":
                cycles.append(path[path.index(nxt):] + [nxt])
            elif nxt not in state:
                visit(nxt, path + [nxt])
        state[node] = "done"

    for node in sorted(graph):
        if node not in state:
            visit(node, [node])
    return cycles


@pytest.mark.parametrize("package", ["mgrpo_algo", "mgrpo_env", "tools", "scenarios"])
def test_no_import_cycles(package):
    assert _cycles(_graph(package)) == []


def test_cycle_finder_finds_a_cycle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c", "a"]]


def test_backend_registries_resolve():
    from mgrpo_algo.distributed.placement import PLACEMENTS, RoleHandle
    from mgrpo_algo.distributed.store import STORE_BACKENDS, StatsStore

    assert PLACEMENTS.names() == ("local", "processes", "ray")
    pytest.importorskip("ray")
    for name in PLACEMENTS:
        assert issubclass(PLACEMENTS.get(name), RoleHandle), name
    for name in STORE_BACKENDS:
        opener = resolve_name(STORE_BACKENDS.get(name).open)
        assert callable(opener) and (not isinstance(opener, type) or issubclass(opener, StatsStore)), name


def _third_party(package: str) -> set[str]:
    names = set()
    for path in (ROOT / package).rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names |= {a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
                names.add(node.module.split(".")[0])
    return names


def test_packages_keep_to_their_side():
    assert not {"torch", "transformers", "mgrpo_algo"} & _third_party("mgrpo_env"), "the env never imports torch"
    assert not {"bs4", "lxml", "playwright", "tantivy"} & _third_party("mgrpo_algo"), "the algorithm parses no HTML"
    assert not {"mgrpo_env", "mgrpo_algo", "mgrpo_scenarios", "torch"} & _third_party("tools"), "tools know neither"


def test_no_package_file_over_500_lines():
    """A file longer than that holds more than one thing (issue 52): split it where its parts meet."""
    long = {str(p.relative_to(ROOT)): n for package in ("mgrpo_algo", "mgrpo_env", "tools", "scenarios")
            for p in (ROOT / package).rglob("*.py") if (n := len(p.read_text().splitlines())) > 500}
    assert long == {}
