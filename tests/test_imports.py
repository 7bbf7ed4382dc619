"""Every ``from cadence.x import y`` in the package, its examples, scripts, trace scripts and
tests names something that exists: GPU-only examples and scripts never run on a CPU machine,
so a name moved to another module would otherwise go unnoticed until a GPU run."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = ("cadence", "examples", "scripts", "nsys", "tests")


def _imports() -> list[tuple[str, str, str]]:
    found = []
    for folder in FOLDERS:
        for path in sorted((ROOT / folder).rglob("*.py")):
            tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
            for node in ast.walk(tree):
                if (isinstance(node, ast.ImportFrom) and node.level == 0 and node.module
                        and node.module.split(".")[0] == "cadence"):
                    where = str(path.relative_to(ROOT))
                    found += [(where, node.module, alias.name) for alias in node.names]
    return found


def test_every_cadence_import_resolves() -> None:
    if importlib.util.find_spec("triton") is None:
        pytest.skip("triton is not installed: the kernel modules define nothing to import")
    missing = []
    imports = _imports()
    assert len(imports) > 500  # the walk found the tree
    for where, module, name in imports:
        try:
            owner = importlib.import_module(module)
        except ImportError as exc:
            missing.append(f"{where}: {module} ({exc})")
            continue
        if name == "*" or hasattr(owner, name):
            continue
        try:
            importlib.import_module(f"{module}.{name}")
        except ImportError:
            missing.append(f"{where}: {module}.{name}")
    assert not missing, missing
