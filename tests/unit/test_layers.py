"""The boundaries the code keeps: the API reaches agents through the engine's agent door only
(so who may see an agent is decided in one place), the metrics read the snapshot the engine
publishes, the cache's rooms import one way, the engine, the cache and the backends take
options cut for them, never the whole settings object, and the commands import the server,
never the reverse, with the benchmark client a package of its own behind one verb."""

from __future__ import annotations

import ast
from pathlib import Path

import semantic

PACKAGE = Path(semantic.__file__).parent


def imported_modules(path: Path) -> set[str]:
    modules: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            modules |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module is not None:
            # `from semantic import cli` imports `semantic.cli`: each name may be a module.
            modules |= {node.module, *(f"{node.module}.{alias.name}" for alias in node.names)}
    return modules


def test_the_api_and_the_metrics_reach_agents_only_through_the_door() -> None:
    readers = [*sorted((PACKAGE / "api").glob("*.py")), PACKAGE / "observability.py"]
    reaching = [p.name for p in readers if "engine.agents" in p.read_text()]
    assert reaching == []
    assert not any("semantic.cache.agents.store" in imported_modules(p) for p in readers)


def test_the_engine_the_cache_and_the_backends_take_options_not_settings() -> None:
    # The engine host swaps models: it keeps the settings for the swap's timeouts and registry.
    parts = [
        *(p for p in (PACKAGE / "engine").glob("*.py") if p.name != "host.py"),
        *(PACKAGE / "cache").rglob("*.py"),
        PACKAGE / "backends" / "__init__.py",
    ]
    reaching = [
        (p.name, module)
        for p in parts
        for module in imported_modules(p)
        if _within(module, "semantic.settings") and not _within(module, "semantic.settings.options")
    ]
    assert reaching == []


def test_the_metrics_read_only_the_snapshot_the_engine_publishes() -> None:
    imported = imported_modules(PACKAGE / "observability.py")
    assert "semantic.engine.engine" not in imported
    assert not any(module.startswith("semantic.cache.agents") for module in imported)


def test_the_cache_rooms_import_one_way_agents_then_disk_then_pages() -> None:
    # pages/ is the pool in memory, disk/ the tier below it, agents/ what uses both; none of
    # them imports the engine.
    above = {"pages": ("disk", "agents"), "disk": ("agents",), "agents": ()}
    for room, higher in above.items():
        for path in (PACKAGE / "cache" / room).glob("*.py"):
            for module in imported_modules(path):
                assert not module.startswith("semantic.engine"), (path.name, module)
                for other in higher:
                    assert not module.startswith(f"semantic.cache.{other}"), (path.name, module)


def test_the_server_imports_no_command_and_no_benchmark_client() -> None:
    # The commands build the server from the settings; the server never reaches back up.
    commands = PACKAGE / "commands"
    entry = {PACKAGE / "cli.py", PACKAGE / "__main__.py"}
    server = [p for p in PACKAGE.rglob("*.py") if p.parent != commands and p not in entry]
    above = ("semantic.commands", "semantic.cli", "semantic_bench")
    reaching = [
        (str(p.relative_to(PACKAGE)), module)
        for p in server
        for module in imported_modules(p)
        if any(_within(module, name) for name in above)
    ]
    assert reaching == []


def test_only_the_bench_verb_imports_the_benchmark_client() -> None:
    users = [
        str(p.relative_to(PACKAGE))
        for p in sorted(PACKAGE.rglob("*.py"))
        if any(_within(module, "semantic_bench") for module in imported_modules(p))
    ]
    assert users == ["commands/bench.py"]


def _within(module: str, package: str) -> bool:
    return module == package or module.startswith(f"{package}.")
