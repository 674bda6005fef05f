"""A cache is never read into other weights: the fingerprint of a checkpoint's weights tags its
KV cache, so two checkpoints of one shape served under one name keep apart caches."""

from __future__ import annotations

import asyncio
import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from semantic.commands.loader import build_engine
from semantic.core import Request, SamplingParams, TokenEvent
from semantic.engine.engine import Engine
from semantic.models.checkpoint import load_checkpoint
from semantic.models.fingerprint import WINDOW
from semantic.settings.settings import Settings
from tests.unit.test_gguf_loader import hf_weights, write_gguf
from tests.unit.tiny_llama import write_hf_dir

pytest.importorskip("torch")


def fingerprint_of(path: Path) -> str:
    return load_checkpoint(path, progress=False).fingerprint


def gguf_with(path: Path, tokenizer_dir: Path, **changes: np.ndarray) -> Path:
    write_gguf(path, tokenizer_dir, hf_weights() | changes)
    return path


def test_two_gguf_files_of_one_shape_have_different_fingerprints(
    tmp_path: Path, tiny_tokenizer_dir: Path
) -> None:
    base = gguf_with(tmp_path / "base.gguf", tiny_tokenizer_dir)
    norm = hf_weights()["output_norm.weight"]
    tuned = gguf_with(
        tmp_path / "tuned.gguf", tiny_tokenizer_dir, **{"output_norm.weight": norm * 1.01}
    )
    copy = shutil.copy(base, tmp_path / "elsewhere.gguf")
    assert fingerprint_of(base) != fingerprint_of(tuned)  # one small tensor trained
    assert fingerprint_of(base) == fingerprint_of(Path(copy))  # the bytes, not the path


def test_a_change_in_the_middle_of_a_large_tensor_changes_the_fingerprint(
    tmp_path: Path, tiny_tokenizer_dir: Path
) -> None:
    embedding = hf_weights()["token_embd.weight"]  # 400 x 64 float32: 100 KiB, sampled
    assert embedding.nbytes > 3 * WINDOW
    trained = embedding * 1.001  # a fine-tune moves every element a little
    base = gguf_with(tmp_path / "base.gguf", tiny_tokenizer_dir)
    tuned = gguf_with(tmp_path / "tuned.gguf", tiny_tokenizer_dir, **{"token_embd.weight": trained})
    assert fingerprint_of(base) != fingerprint_of(tuned)


def test_hf_folders_differ_by_weights_and_by_config_not_by_place(
    tmp_path: Path, tiny_tokenizer_dir: Path
) -> None:
    first = write_hf_dir(tmp_path / "first", tiny_tokenizer_dir, seed=0)
    second = write_hf_dir(tmp_path / "second", tiny_tokenizer_dir, seed=1)
    copy = Path(shutil.copytree(first, tmp_path / "copy"))
    assert fingerprint_of(first) != fingerprint_of(second)
    assert fingerprint_of(first) == fingerprint_of(copy)
    config = json.loads((copy / "config.json").read_text())
    (copy / "config.json").write_text(json.dumps(config | {"rope_theta": 1234.0}))
    assert fingerprint_of(first) != fingerprint_of(copy)  # same weights, other KV


def turn(engine: Engine, prompt: list[int]) -> TokenEvent:
    """One turn of agent `alice` on a started engine; its last event."""
    request = Request("turn", prompt, SamplingParams(temperature=0.0, max_tokens=2), "alice")

    async def last() -> TokenEvent:
        async for event in engine.stream(request):
            if event.final:
                return event
        raise AssertionError("no final event")

    engine.start()
    try:
        return asyncio.run(last())
    finally:
        engine.stop()  # persists every hot cache


def test_a_second_checkpoint_of_one_shape_under_the_same_name_does_not_read_the_first_cache(
    tmp_path: Path, tiny_tokenizer_dir: Path
) -> None:
    """`--served-model-name` kept while `--model` changes to other weights of the same shape:
    the cache the first wrote is a miss for the second, and still a hit for the first."""
    first = write_hf_dir(tmp_path / "base", tiny_tokenizer_dir, seed=0)
    second = write_hf_dir(tmp_path / "fine-tune", tiny_tokenizer_dir, seed=1)

    def engine_for(model: Path) -> Engine:
        settings = Settings(
            model=str(model),
            served_model_name="assistant",
            cache_dir=tmp_path / "cache",
            block_tokens=16,
            cache_budget_mb=4,
            dtype="float32",
            cpu_kernels=False,
            batch_window_ms=0,
        )
        return build_engine(settings)

    prompt = [5 + k % 300 for k in range(40)]
    written = turn(engine_for(first), prompt)
    assert written.error is None and written.usage is not None
    other = turn(engine_for(second), prompt)
    assert other.usage is not None and other.usage.cached_tokens == 0
    again = turn(engine_for(first), prompt)
    assert again.usage is not None and again.usage.cached_tokens == len(prompt) - 1
    assert len(list((tmp_path / "cache" / "kv").iterdir())) == 2  # a folder for each
