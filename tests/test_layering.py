"""The package's shape (STYLE.md): kernels import nothing of kvtrace but its config
(and each other); the CLI and the app never import the kernels directly."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PKG = ROOT / "analytics" / "kvtrace"


def _imports(path: Path) -> list[str]:
    """Absolute module names a file imports (relative ones resolved in the package)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    for node in ast.walk(tree):  # imports for type checkers only are not dependencies
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            node.body = []
    base_dir = PKG.parent if path.is_relative_to(PKG.parent) else ROOT  # app files: relative to the app
    here = path.relative_to(base_dir).with_suffix("").parts  # e.g. ("kvtrace", "kernels", "shards")
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = list(here[:-node.level])
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            out.append(mod)
            out += [f"{mod}.{a.name}" for a in node.names]
    return out


def test_kernels_import_only_config_and_each_other():
    for path in sorted((PKG / "kernels").glob("*.py")):
        for mod in _imports(path):
            if mod.startswith("kvtrace"):
                assert mod == "kvtrace" or mod.startswith(("kvtrace.config", "kvtrace.kernels")), (path.name, mod)


def test_cli_and_app_do_not_import_kernels():
    files = [*sorted((PKG / "cli").rglob("*.py")), *sorted((PKG / "app").rglob("*.py"))]
    assert len(files) > 3
    for path in files:
        bad = [m for m in _imports(path) if m.startswith("kvtrace.kernels")]
        assert not bad, (path.relative_to(ROOT), bad)


# ------------------------------------------------------------------------ the layer contract

#: The layers, lowest first: a module may import its own layer and those below, never above.
#: ``base`` is the vocabulary every layer shares (errors, units, names, model presets,
#: atomic outputs, Numba flags).
LAYERS = ["base", "kernels", "trace", "ingest", "analyses", "results", "surfaces"]
_BASE = {"kvtrace", "kvtrace.config", "kvtrace.errors", "kvtrace.units", "kvtrace.names", "kvtrace.model",
         "kvtrace.gpu", "kvtrace.presets", "kvtrace.outputs"}
_SURFACES = ("kvtrace.cli", "kvtrace.app", "kvtrace.sql")


def layer_of(module: str) -> str:
    """The layer of a module of the package (``kvtrace.analyses.curves`` -> ``analyses``)."""
    if module in _BASE or module.rsplit(".", 1)[0] in _BASE - {"kvtrace"}:
        return "base"
    if module.startswith(_SURFACES):
        return "surfaces"
    part = module.split(".")[1]
    assert part in LAYERS, f"{module}: not in a layer (add it to tests/test_layering.py and the README's Layout)"
    return part


def _modules() -> dict[str, Path]:
    out = {}
    for path in sorted(PKG.rglob("*.py")):
        parts = path.relative_to(PKG.parent).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


def _package_imports(path: Path, modules: dict[str, Path]) -> set[str]:
    """The package's modules a file imports, anywhere in it (lazy imports count)."""
    out = set()
    for name in _imports(path):
        while name and name not in modules:
            name = name.rpartition(".")[0]
        if name and name.startswith("kvtrace"):
            out.add(name)
    return out


def test_every_import_goes_down_the_layers():
    modules = _modules()
    rank = {name: i for i, name in enumerate(LAYERS)}
    bad = []
    for mod, path in modules.items():
        for dep in _package_imports(path, modules):
            if dep != "kvtrace" and rank[layer_of(dep)] > rank[layer_of(mod)]:
                bad.append(f"{mod} ({layer_of(mod)}) imports {dep} ({layer_of(dep)})")
    assert not bad, "\n".join(bad)


def test_no_import_cycle():
    modules = _modules()
    graph = {m: {d for d in _package_imports(p, modules) if d != m and d != "kvtrace"} for m, p in modules.items()}
    # a package's __init__ re-exporting its modules is not a cycle with them
    graph = {m: {d for d in ds if not (m.startswith(d + ".") and modules[d].name == "__init__.py")}
             for m, ds in graph.items()}
    seen, stack, cycles = set(), [], []

    def visit(m):
        if m in stack:
            cycles.append(stack[stack.index(m):] + [m])
            return
        if m in seen:
            return
        seen.add(m)
        stack.append(m)
        for d in sorted(graph.get(m, ())):
            visit(d)
        stack.pop()

    for m in sorted(graph):
        visit(m)
    assert not cycles, "\n".join(" -> ".join(c) for c in cycles)


def test_modules_stay_readable():
    """No module over ~800 lines, unless its docstring says why it must stay one."""
    long = [f"{p.relative_to(ROOT)}: {n} lines" for p in sorted(PKG.rglob("*.py"))
            if (n := len(p.read_text().splitlines())) > 850 and "must stay one" not in p.read_text()[:3000]]
    assert not long, "\n".join(long)


def test_no_private_name_crosses_a_module_boundary():
    """What one module takes from another is that module's public interface."""
    modules = _modules()
    crossing = []
    for mod, path in modules.items():
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("kvtrace"):
                crossing += [f"{mod} imports {node.module}.{a.name}" for a in node.names
                             if a.name.startswith("_") and not a.name.startswith("__")]
    assert not crossing, "\n".join(crossing)
