"""The real Gemma 3 270M (the `gemma3-270m` alias: a Q4_K_M GGUF joined from its packages)
through `/v1/completions`, against transformers loading the same GGUF in float32: the same
greedy continuations, one prompt longer than the 512-token sliding window. Skipped where the
`semantic[gemma3]` extra is not installed."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import torch
from fastapi.testclient import TestClient

from semantic.api.app import create_app
from semantic.commands.loader import build_engine
from semantic.errors import ModelLoadFailed
from semantic.models.registry import GEMMA3_270M, ModelRegistry, ModelSource
from semantic.settings.settings import Settings

pytestmark = pytest.mark.integration

STORY = (
    "The lighthouse keeper climbed the stairs every evening at dusk, counting the steps as "
    "his father had taught him, and each night the sea below said something different. "
)
PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):\n",
    "Once upon a time, in a small village by the mountains,",
    STORY * 22 + "On the last night of the year, he",  # ~750 tokens: past the window
]


@pytest.fixture(scope="module")
def gemma(tmp_path_factory: pytest.TempPathFactory) -> ModelSource:
    if GEMMA3_270M.locate() is None:
        pytest.skip("the semantic[gemma3] extra is not installed")
    try:
        return ModelRegistry(models_dir=tmp_path_factory.mktemp("models")).resolve("gemma3-270m")
    except ModelLoadFailed as exc:
        pytest.skip(str(exc))


@pytest.fixture(scope="module")
def client(gemma: ModelSource, tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestClient]:
    settings = Settings(
        model="gemma3-270m",
        dtype="float32",
        cache_dir=tmp_path_factory.mktemp("cache"),
        block_tokens=64,
        batch_window_ms=0,
    )
    engine = build_engine(settings, gemma)
    with TestClient(create_app(engine, settings)) as test_client:
        yield test_client


@pytest.fixture(scope="module")
def reference(gemma: ModelSource) -> Any:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = gemma.path
    model = AutoModelForCausalLM.from_pretrained(
        path.parent, gguf_file=path.name, dtype=torch.float32
    )
    return model.eval(), AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)


def test_the_alias_is_joined_once_into_the_models_folder(gemma: ModelSource) -> None:
    assert gemma.path.name == GEMMA3_270M.filename and gemma.format == "gguf"
    assert gemma.path.parent.name.startswith("models")
    mtime = gemma.path.stat().st_mtime_ns
    again = ModelRegistry(models_dir=gemma.path.parent).resolve("gemma-3-270m")
    assert again.path == gemma.path and gemma.path.stat().st_mtime_ns == mtime


@torch.inference_mode()
def test_greedy_completions_equal_transformers_on_the_same_gguf(
    client: TestClient, reference: Any
) -> None:
    model, tokenizer = reference
    lengths = []
    for prompt in PROMPTS:
        ids = tokenizer(prompt, return_tensors="pt").input_ids
        lengths.append(ids.shape[1])
        out = model.generate(ids, do_sample=False, max_new_tokens=32, attention_mask=None)
        expected = tokenizer.decode(out[0, ids.shape[1] :], skip_special_tokens=True)
        body = {"model": "gemma3-270m", "prompt": prompt, "max_tokens": 32, "temperature": 0}
        response = client.post("/v1/completions", json=body)
        assert response.status_code == 200, response.text
        choice = response.json()["choices"][0]
        assert response.json()["usage"]["prompt_tokens"] == ids.shape[1]
        assert choice["text"] == expected, prompt[-60:]
    assert max(lengths) > 512 + 32  # the long prompt runs past the sliding window
