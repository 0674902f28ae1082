"""The dependency rule: gateway -> {policies, backends, bundles}; the lower three never import
the gateway or each other."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LOWER = ("backends", "policies", "bundles")


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _imported_modules(source: str, module: str, is_package: bool) -> list[tuple[int, str]]:
    """(line, absolute module name) for every import in `source`, relative ones resolved, plus
    `importlib.import_module("...")` / `__import__("...")` calls with a literal name."""
    package = module.split(".") if is_package else module.split(".")[:-1]
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found.extend((node.lineno, alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                # `from ..x import y`: drop level-1 trailing parts of the package; climbing above
                # the top level (an ImportError at run time) still counts as naming `x`.
                base = package[: max(len(package) - (node.level - 1), 0)]
                target = ".".join([*base, *([node.module] if node.module else [])])
            else:
                target = node.module or ""
            if target:
                found.append((node.lineno, target))
            # `from backends import gateway` names a module as well as a package
            found.extend(
                (node.lineno, f"{target}.{a.name}" if target else a.name) for a in node.names
            )
        elif isinstance(node, ast.Call) and node.args:
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            first = node.args[0]
            if (
                name in ("import_module", "__import__")
                and isinstance(first, ast.Constant)
                and isinstance(first.value, str)
            ):
                found.append((node.lineno, first.value))
    return found


def _violations(path: Path) -> list[str]:
    module = _module_name(path)
    own = module.split(".")[0]
    forbidden = {"gateway", *LOWER} - {own}
    imports = _imported_modules(
        path.read_text(encoding="utf-8"), module, is_package=path.name == "__init__.py"
    )
    return [
        f"{path.relative_to(ROOT)}:{line} imports {name}"
        for line, name in imports
        if name.split(".")[0] in forbidden
    ]


def _lower_files() -> list[Path]:
    return sorted(p for package in LOWER for p in (ROOT / package).rglob("*.py"))


def test_lower_packages_exist() -> None:
    for package in LOWER:
        assert (ROOT / package / "__init__.py").is_file(), package
    # The parametrized test below must see the real tree, not an empty list.
    assert ROOT / "backends" / "_text.py" in _lower_files()


@pytest.mark.parametrize("path", _lower_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_lower_module_imports_neither_the_gateway_nor_a_sibling(path: Path) -> None:
    assert _violations(path) == []


@pytest.mark.parametrize(
    ("module", "is_package", "source", "bad"),
    [
        ("backends.x", False, "import gateway", True),
        ("backends.x", False, "import gateway.errors as e", True),
        ("backends.x", False, "from gateway.config import load_settings", True),
        ("backends.x", False, "from gateway import errors", True),
        ("backends.llamacpp.engine", False, "from ...gateway import errors", True),
        ("backends.x", False, "from .. import gateway", True),
        ("policies.x", False, "import backends.types", True),
        ("bundles", True, "from backends import errors", True),
        ("backends.x", False, "import importlib\nimportlib.import_module('gateway.app')", True),
        ("backends.x", False, "def f():\n    from gateway import app\n", True),
        ("backends.llamacpp.engine", False, "from ..errors import EngineError", False),
        ("backends.llamacpp", True, "from .engine import LlamaCppEngine", False),
        ("backends.x", False, "import msgspec\nfrom backends.types import Usage", False),
        ("backends.x", False, "import gateways_lookalike", False),
    ],
)
def test_the_import_checker_itself(module: str, is_package: bool, source: str, bad: bool) -> None:
    own = module.split(".")[0]
    forbidden = {"gateway", *LOWER} - {own}
    names = [n for _, n in _imported_modules(source, module, is_package)]
    assert any(n.split(".")[0] in forbidden for n in names) == bad, names


def test_import_linter_contracts_are_kept() -> None:
    lint_imports = Path(sys.executable).with_name("lint-imports")
    if not lint_imports.exists():
        pytest.fail(f"import-linter is not installed next to {sys.executable} (pip install .[dev])")
    result = subprocess.run(
        [str(lint_imports), "--no-cache", "--no-logo", str(ROOT / "pyproject.toml")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 broken" in result.stdout
    assert "2 kept" in result.stdout
