"""A loaded checkpoint: config, tokenizer and chat template at once, weights lazily, any format.

`load_checkpoint` is the one entry point: it dispatches on a GGUF file or a Hugging Face directory,
and gives backends the same thing either way.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import numpy as np
from rich.console import Console
from rich.progress import track

from semantic.core import DefaultSampling
from semantic.errors import ModelLoadFailed
from semantic.models.config import ModelConfig
from semantic.models.gguf import GGUFFile
from semantic.models.hf import HFDir
from semantic.models.q6k import Blocks
from semantic.text.builtin_templates import builtin_template
from semantic.text.chat import ChatTemplate
from semantic.text.tokenizer import Tokenizer

_T = TypeVar("_T")
Weights = Callable[[], Iterator[tuple[str, np.ndarray]]]
WeightBlocks = Callable[[], Iterator[tuple[str, np.ndarray | Blocks]]]


@dataclass(slots=True, frozen=True)
class Checkpoint:
    """Everything a backend and the text layer need from one checkpoint.

    `weights()` yields `(Hugging Face name, float32 array)` one tensor at a time, so a backend can
    convert each to its own dtype and device before the next is read; each call starts over.
    `fingerprint` names the weights (`models/fingerprint.py`): it tags their KV cache. A GGUF
    file's `blocks()` yields the same tensors with its matrices in a block type a backend
    computes on (Q4_K, Q5_K, Q6_K, Q4_0 .. Q8_0) as their blocks (`Q4KBlocks`, `Q6KBlocks`,
    `Q32Blocks`) where nothing but a row order changes them; None where there are none to keep
    (float tensors only, a Hugging Face directory). `k_blocks`: some of them are Q4_K or Q5_K,
    which make "auto" weights "gguf" (Q4_K torch's int4 kernel computes on too, where ours do
    not run).
    """

    config: ModelConfig
    tokenizer: Tokenizer
    chat_template: ChatTemplate
    path: Path
    fingerprint: str
    weights: Weights
    template_origin: str = "file"  # "file", or "built-in <name>" when the file has none
    blocks: WeightBlocks | None = None
    sampling: DefaultSampling | None = None  # what the files recommend, if they do
    k_blocks: bool = False


def load_checkpoint(path: Path, *, progress: bool) -> Checkpoint:
    """Open a GGUF file or Hugging Face directory. With `progress`, iterating the weights shows a
    progress bar when stderr is a terminal."""
    if path.is_dir():
        return _load_hf(path, progress)
    if path.is_file():
        return _load_gguf(path, progress)
    raise ModelLoadFailed(f"no model at {path}")


def _load_gguf(path: Path, progress: bool) -> Checkpoint:
    gguf = GGUFFile(path)
    config = gguf.config()
    tokenizer = Tokenizer.from_gguf(gguf.metadata, extra_eos_ids=config.eos_token_ids)

    def weights() -> Iterator[tuple[str, np.ndarray]]:
        return _with_progress(gguf.weights(config), gguf.num_tensors, progress)

    def blocks() -> Iterator[tuple[str, np.ndarray | Blocks]]:
        return _with_progress(gguf.weights(config, blocks=True), gguf.num_tensors, progress)

    template, origin = _chat_template(gguf.chat_template, tokenizer, config)
    fingerprint = gguf.fingerprint()
    kept = blocks if gguf.has_blocks(config) else None
    k_blocks = kept is not None and gguf.has_k_blocks()
    return Checkpoint(
        config,
        tokenizer,
        template,
        path,
        fingerprint,
        weights,
        origin,
        kept,
        gguf.sampling,
        k_blocks,
    )


def _load_hf(path: Path, progress: bool) -> Checkpoint:
    hf = HFDir(path)
    config = hf.config()
    tokenizer = Tokenizer.from_hf_dir(path, extra_eos_ids=config.eos_token_ids)

    def weights() -> Iterator[tuple[str, np.ndarray]]:
        return _with_progress(hf.weights(), hf.num_tensors, progress)

    template, origin = _chat_template(hf.chat_template, tokenizer, config)
    return Checkpoint(
        config, tokenizer, template, path, hf.fingerprint(), weights, origin, sampling=hf.sampling()
    )


def template_origin(path: Path) -> str:
    """Where the chat template of the model at `path` comes from, reading only metadata:
    "file", or "built-in <name>" (what `semantic models` shows)."""
    if path.is_dir():
        source, model_type = HFDir(path).chat_template, HFDir(path).config().model_type
    else:
        gguf = GGUFFile(path)
        source, model_type = gguf.chat_template, gguf.config().model_type
    return "file" if source else f"built-in {builtin_template(model_type).name}"


def _chat_template(
    source: str | None, tokenizer: Tokenizer, config: ModelConfig
) -> tuple[ChatTemplate, str]:
    """The file's template, or its family's built-in one, and which it is."""
    origin = "file"
    if not source:
        builtin = builtin_template(config.model_type)
        source, origin = builtin.source, f"built-in {builtin.name}"
    template = ChatTemplate(source, bos_token=tokenizer.bos_token, eos_token=tokenizer.eos_token)
    return template, origin


def _with_progress(tensors: Iterator[_T], total: int, progress: bool) -> Iterator[_T]:
    console = Console(stderr=True)
    if not (progress and console.is_terminal):
        return tensors
    return iter(
        track(tensors, total=total, description="Loading weights", console=console, transient=True)
    )
