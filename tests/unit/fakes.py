"""Engines over the fake runner and a tiny tokenizer, shared by the unit tests."""

from __future__ import annotations

from pathlib import Path

from semantic.backends.fake import FakeRunner
from semantic.config import Settings
from semantic.engine.engine import Engine
from semantic.models.config import ModelConfig
from semantic.models.served import ServedModel
from semantic.text.chat import ChatTemplate
from semantic.text.tokenizer import Tokenizer

CONTEXT = 512


def fake_served(tokenizer: Tokenizer, name: str = "tiny") -> ServedModel:
    config = ModelConfig("llama", 400, 8, 16, 1, 1, 1, 8, CONTEXT)
    template = ChatTemplate("", bos_token=None, eos_token=None)
    return ServedModel(name, config, tokenizer, template, CONTEXT)


def make_engine(
    served: ServedModel, cache_dir: Path, **overrides: object
) -> tuple[Engine, FakeRunner]:
    """An engine on a fake runner (32 blocks of 8 tokens unless overridden) caching under
    `cache_dir`; overrides go to the runner or the settings, by name."""
    runner_args: dict[str, object] = {
        "num_blocks": 32,
        "block_tokens": 8,
        "vocab_size": 400,
        "first_token_id": 3,
        "fail_on_token": None,
    }
    runner_args |= {k: overrides.pop(k) for k in list(overrides) if k in runner_args}
    runner = FakeRunner(**runner_args)  # type: ignore[arg-type]
    settings = Settings(
        max_batch_tokens=32,
        batch_window_ms=0,
        cache_dir=cache_dir,
        **overrides,  # type: ignore[arg-type]
    )
    return Engine(runner, served, settings), runner
