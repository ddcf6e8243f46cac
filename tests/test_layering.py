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
