"""The pure core — the domain nouns, the block pool, the prefix index, the block manager, the
scheduler and its drafts — imports only the standard library and itself, so it can be read,
tested and reused without torch, numpy or a server."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

SRC = Path(__file__).parents[2] / "src" / "semantic"
CORE = {
    "semantic.core": SRC / "core.py",
    "semantic.cache.pages.block_pool": SRC / "cache" / "pages" / "block_pool.py",
    "semantic.cache.pages.prefix": SRC / "cache" / "pages" / "prefix.py",
    "semantic.cache.pages.block_manager": SRC / "cache" / "pages" / "block_manager.py",
    "semantic.engine.scheduler": SRC / "engine" / "scheduler.py",
    "semantic.engine.drafts": SRC / "engine" / "drafts.py",
}


def imported_modules(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module)
    return names


def test_the_pure_core_imports_only_the_standard_library_and_itself() -> None:
    for module, path in CORE.items():
        outside = {
            name
            for name in imported_modules(path)
            if name not in CORE
            and name.split(".")[0] not in sys.stdlib_module_names
            and name != "__future__"
        }
        assert outside == set(), f"{module} imports {sorted(outside)}"
