"""Compute backends, imported lazily by name so the package imports without torch or mlx."""

from __future__ import annotations

import importlib
import importlib.util
import platform
import sys
from collections.abc import Iterable, Iterator
from dataclasses import replace

import numpy as np

from semantic.engine.runner import ModelRunner
from semantic.errors import ModelLoadFailed
from semantic.models.checkpoint import Checkpoint
from semantic.models.config import ModelConfig
from semantic.models.q6k import Blocks
from semantic.settings.options import RunnerOptions

Tensors = Iterator[tuple[str, np.ndarray | Blocks]]

_RUNNERS = {
    "torch": ("semantic.backends.torch.runner", "TorchRunner"),
    "mlx": ("semantic.backends.mlx.runner", "MLXRunner"),
}


def create_runner(
    options: RunnerOptions,
    config: ModelConfig,
    weights: Iterable[tuple[str, np.ndarray | Blocks]],
    weights_fingerprint: str | None = None,
) -> ModelRunner:
    """Build the runner of `options.backend` ("auto" picks this platform's) for a model; its
    `weights_fingerprint` names the weights it may keep prepared (None: none kept)."""
    name = default_backend() if options.backend == "auto" else options.backend
    if name not in _RUNNERS:
        raise ModelLoadFailed(f"unknown backend {name!r}; known: {sorted(_RUNNERS)}")
    if options.weights == "auto":  # not resolved for a checkpoint: tensors as loaded
        options = replace(options, weights=weight_format(options, gguf=False))
    module_name, class_name = _RUNNERS[name]
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ModelLoadFailed(f"backend {name!r} is not available here: {exc}") from exc
    keywords = {**options.keywords(), "weights_fingerprint": weights_fingerprint}
    runner: ModelRunner = getattr(module, class_name)(config, weights, **keywords)
    return runner


def with_weights(options: RunnerOptions, checkpoint: Checkpoint) -> tuple[RunnerOptions, Tensors]:
    """`options` with their weight format resolved for `checkpoint` (`weight_format`), and the
    checkpoint's tensors as that format reads them: a GGUF's blocks kept for "gguf"."""
    blocks = checkpoint.blocks is not None
    resolved = replace(
        options, weights=weight_format(options, blocks, k_blocks=blocks and checkpoint.k_blocks)
    )
    if resolved.weights == "gguf" and checkpoint.blocks is not None:
        return resolved, checkpoint.blocks()
    return resolved, checkpoint.weights()


def weight_format(options: RunnerOptions, gguf: bool, k_blocks: bool = True) -> str:
    """`options.weights`, "auto" resolved for a checkpoint (`gguf`: a GGUF file with blocks to
    keep, `k_blocks`: some of them Q4_K or Q5_K) on this machine: the torch backend's choice for
    such a file (`auto_weight_format`), "bf16" (as loaded) otherwise."""
    if options.weights != "auto":
        return options.weights
    name = default_backend() if options.backend == "auto" else options.backend
    if name != "torch" or not gguf:
        return "bf16"
    from semantic.backends.torch.runner import auto_weight_format

    return auto_weight_format(options.device, k_blocks)


def default_backend() -> str:
    """mlx on Apple Silicon where MLX is installed, torch elsewhere (and on a Mac without it)."""
    apple_silicon = sys.platform == "darwin" and platform.machine() == "arm64"
    return "mlx" if apple_silicon and _exists("mlx") else "torch"


def _exists(module_name: str) -> bool:
    try:
        return importlib.util.find_spec(module_name) is not None
    except ModuleNotFoundError:  # a parent package is missing
        return False
