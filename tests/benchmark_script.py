"""A script under `benchmarks/` loaded as a module, for the tests of its parts."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

BENCHMARKS = Path(__file__).parents[1] / "benchmarks"


def load_benchmark(name: str) -> ModuleType:
    """`benchmarks/<name>.py`, imported as the module `name`; it imports its siblings as it
    does when run (`benchmarks/` is on the path, last)."""
    if str(BENCHMARKS) not in sys.path:
        sys.path.append(str(BENCHMARKS))
    spec = importlib.util.spec_from_file_location(name, BENCHMARKS / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up while they are made
    spec.loader.exec_module(module)
    return module
