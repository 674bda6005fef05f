"""Fixtures of the tests on the real SmolLM2 weights: its checkpoint, and transformers' model of
it (fp32), the reference for greedy parity and for the tensors our loader reads."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from semantic.models.checkpoint import Checkpoint, load_checkpoint
from semantic.models.served import ServedModel


@pytest.fixture(scope="module")
def checkpoint(smollm2_path: Path) -> Checkpoint:
    return load_checkpoint(smollm2_path, progress=False)


def served_smollm2(checkpoint: Checkpoint) -> ServedModel:
    """The checkpoint as the server serves it: its tokenizer, template and full context."""
    return ServedModel(
        "smollm2-135m",
        checkpoint.config,
        checkpoint.tokenizer,
        checkpoint.chat_template,
        checkpoint.config.max_position_embeddings,
        checkpoint.fingerprint,
    )


# One per session, not per module: transformers takes ~20 s to read a GGUF (most of it parsing
# the vocabulary's strings), and several modules compare against the same model.
@pytest.fixture(scope="session")
def reference(smollm2_path: Path) -> Any:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(
        smollm2_path.parent, gguf_file=smollm2_path.name, torch_dtype=torch.float32
    )
    return model.eval()
