"""Compute backends, imported lazily by name so the package imports without torch or mlx."""

from __future__ import annotations

import importlib
import importlib.util
import platform
import sys
from collections.abc import Iterable
from typing import Any

import numpy as np

from semantic.config import Settings, default_cache_dir
from semantic.engine.runner import ModelRunner
from semantic.errors import ModelLoadFailed
from semantic.models.config import ModelConfig

_RUNNERS = {
    "torch": ("semantic.backends.torch.runner", "TorchRunner"),
    "mlx": ("semantic.backends.mlx.runner", "MLXRunner"),
}


def create_runner(
    backend: str | Settings,
    config: ModelConfig,
    weights: Iterable[tuple[str, np.ndarray]],
    **options: Any,
) -> ModelRunner:
    """Build a backend's runner. `backend` is a name ("auto", "torch", "mlx") with the runner's
    keyword settings in `options`, or the `Settings`, which supplies both."""
    if isinstance(backend, Settings):
        options = {**_options(backend), **options}
        backend = backend.backend
    name = default_backend() if backend == "auto" else backend
    if name not in _RUNNERS:
        raise ModelLoadFailed(f"unknown backend {name!r}; known: {sorted(_RUNNERS)}")
    module_name, class_name = _RUNNERS[name]
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ModelLoadFailed(f"backend {name!r} is not available here: {exc}") from exc
    runner: ModelRunner = getattr(module, class_name)(config, weights, **options)
    return runner


def default_backend() -> str:
    """mlx on Apple Silicon where its runner module exists, torch elsewhere. The mlx backend is
    not written yet: choosing it by platform alone would make `--backend auto` fail there."""
    apple_silicon = sys.platform == "darwin" and platform.machine() == "arm64"
    return "mlx" if apple_silicon and _exists(_RUNNERS["mlx"][0]) else "torch"


def _exists(module_name: str) -> bool:
    try:
        return importlib.util.find_spec(module_name) is not None
    except ModuleNotFoundError:  # a parent package is missing
        return False


def _options(settings: Settings) -> dict[str, Any]:
    return {
        "block_tokens": settings.block_tokens,
        "cache_budget_mb": settings.cache_budget_mb,
        "dtype": settings.dtype,
        "device": settings.device,
        "threads": settings.threads,
        "kernels": settings.cpu_kernels,
        "prepared_dir": default_cache_dir() / "prepared" if settings.prepared_weights else None,
    }
