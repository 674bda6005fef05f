"""The bundled SmolLM2 GGUF read by our loaders equals what transformers reads from it: tensors,
config, tokenizer ids, chat template renders, and decode round-trips."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from semantic.models.checkpoint import Checkpoint
from semantic.text.detokenizer import IncrementalDetokenizer

pytestmark = pytest.mark.integration

TEXTS = [
    "Hello, world!",
    "The quick brown fox jumps over the lazy dog.",
    "  leading and trailing spaces  ",
    "multiple     spaces\tand\ttabs\n\n\nand newlines\r\n",
    "12345 + 67890 = 80235; 3.14159, 1e-9, 0x1F",
    "héllo wörld, naïve café, Straße, ñandú",
    "中文文本，日本語のテキスト、한국어 텍스트",
    "Привет, мир! Γειά σου κόσμε! مرحبا بالعالم",
    "emoji: 😀👍🏽 🇫🇷 👨‍👩‍👧‍👦 🦀",
    "def fib(n: int) -> int:\n    return n if n < 2 else fib(n - 1) + fib(n - 2)\n",
    '{"key": [1, 2, {"nested": null}], "b": true}',
    "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n",
    "<|endoftext|>text after end<|im_end|>",
    "<repo_name>semantic<file_sep>src/main.py",
    "don't won't I'm you're they've we'll she'd",
    "https://example.com/path?query=1&b=2#frag",
    "a" * 50 + " " + "ab" * 20,
    "\u200b zero width \u00a0 nbsp \u2028 line sep",
    "<|im_start",
    "",
]

CONVERSATIONS: list[list[dict[str, Any]]] = [
    [{"role": "user", "content": "Hi!"}],
    [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Name a color."}],
    [
        {"role": "user", "content": "What is 2+2?"},
        {"role": "assistant", "content": "4"},
        {"role": "user", "content": "And 3+3? Answer with émoji 😀."},
    ],
    [
        {"role": "system", "content": "S"},
        {"role": "user", "content": "first"},
        {"role": "assistant", "content": "second"},
    ],
]

# A tool-calling template in the Qwen2.5 style, to pin our `tojson` to transformers' semantics.
TOOL_TEMPLATE = (
    "{%- if tools %}<|im_start|>system\n# Tools\n<tools>"
    "{%- for tool in tools %}\n{{ tool | tojson }}{%- endfor %}\n</tools><|im_end|>\n{%- endif %}"
    "{%- for message in messages %}<|im_start|>{{ message.role }}\n"
    "{{ message.content }}<|im_end|>\n"
    "{%- endfor %}{%- if add_generation_prompt %}<|im_start|>assistant\n{%- endif %}"
)
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Weather for a city <b>now</b> — °C",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        },
    }
]


@pytest.fixture(scope="module")
def reference_tokenizer(smollm2_path: Path) -> Any:
    transformers = pytest.importorskip("transformers")
    return transformers.AutoTokenizer.from_pretrained(
        smollm2_path.parent, gguf_file=smollm2_path.name
    )


def test_tensors_equal_transformers_state_dict(checkpoint: Checkpoint, reference: Any) -> None:
    tensors = reference.state_dict()
    seen = set()
    for name, array in checkpoint.weights():
        expected = tensors[name].float().numpy()
        assert array.dtype == np.float32 and array.shape == expected.shape, name
        np.testing.assert_allclose(array, expected, rtol=0, atol=1e-6, err_msg=name)
        seen.add(name)
    # transformers lists the tied lm_head separately; we leave it to the backend to tie.
    assert set(tensors) - seen == {"lm_head.weight"}
    assert checkpoint.config.tie_word_embeddings


def test_config_matches_transformers_config(checkpoint: Checkpoint, reference: Any) -> None:
    ours, theirs = checkpoint.config, reference.config
    for field in (
        "model_type",
        "vocab_size",
        "hidden_size",
        "intermediate_size",
        "num_hidden_layers",
        "num_attention_heads",
        "num_key_value_heads",
        "head_dim",
        "max_position_embeddings",
        "rms_norm_eps",
        "tie_word_embeddings",
        "attention_bias",
        "bos_token_id",
    ):
        assert getattr(ours, field) == getattr(theirs, field), field
    assert ours.rope_theta == theirs.rope_parameters["rope_theta"]
    assert ours.eos_token_ids == (theirs.eos_token_id,)


@pytest.mark.parametrize("text", TEXTS)
def test_token_ids_equal_transformers(
    checkpoint: Checkpoint, reference_tokenizer: Any, text: str
) -> None:
    expected = reference_tokenizer.encode(text, add_special_tokens=False)
    assert checkpoint.tokenizer.encode(text) == expected


@pytest.mark.parametrize("text", TEXTS)
def test_decode_round_trips_and_matches_transformers(
    checkpoint: Checkpoint, reference_tokenizer: Any, text: str
) -> None:
    tokenizer = checkpoint.tokenizer
    ids = tokenizer.encode(text)
    assert tokenizer.decode(ids, skip_special_tokens=False) == text
    for skip in (True, False):
        assert tokenizer.decode(ids, skip_special_tokens=skip) == reference_tokenizer.decode(
            ids, skip_special_tokens=skip
        )


def test_streamed_detokenization_equals_full_decode(checkpoint: Checkpoint) -> None:
    tokenizer = checkpoint.tokenizer
    ids = tokenizer.encode("".join(TEXTS))
    detokenizer = IncrementalDetokenizer(tokenizer)
    streamed = "".join(detokenizer.push(token) for token in ids) + detokenizer.flush()
    assert streamed == tokenizer.decode(ids)


def test_special_tokens_and_eos_match_transformers(
    checkpoint: Checkpoint, reference_tokenizer: Any
) -> None:
    tokenizer = checkpoint.tokenizer
    assert tokenizer.vocab_size == len(reference_tokenizer)
    assert (tokenizer.bos_token, tokenizer.eos_token) == (
        reference_tokenizer.bos_token,
        reference_tokenizer.eos_token,
    )
    assert tokenizer.eos_token_ids == {reference_tokenizer.eos_token_id}
    special = set(reference_tokenizer.all_special_ids) | {
        i for i, t in reference_tokenizer.added_tokens_decoder.items() if t.special
    }
    assert {i for i in range(tokenizer.vocab_size) if tokenizer.is_special(i)} == special


@pytest.mark.parametrize("conversation", CONVERSATIONS)
@pytest.mark.parametrize("add_generation_prompt", [True, False])
def test_chat_template_render_equals_apply_chat_template(
    checkpoint: Checkpoint,
    reference_tokenizer: Any,
    conversation: list[dict[str, Any]],
    add_generation_prompt: bool,
) -> None:
    expected = reference_tokenizer.apply_chat_template(
        conversation, tokenize=False, add_generation_prompt=add_generation_prompt
    )
    rendered = checkpoint.chat_template.render(
        conversation, add_generation_prompt=add_generation_prompt
    )
    assert rendered == expected
    ids = reference_tokenizer.apply_chat_template(
        conversation, tokenize=True, add_generation_prompt=add_generation_prompt
    )
    ids = ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids
    assert checkpoint.tokenizer.encode(rendered) == list(ids)


def test_tool_template_renders_tools_like_transformers(
    checkpoint: Checkpoint, reference_tokenizer: Any
) -> None:
    from semantic.text.chat import ChatTemplate

    conversation = CONVERSATIONS[0]
    expected = reference_tokenizer.apply_chat_template(
        conversation,
        tools=TOOLS,
        chat_template=TOOL_TEMPLATE,
        tokenize=False,
        add_generation_prompt=True,
    )
    ours = ChatTemplate(TOOL_TEMPLATE, bos_token=None, eos_token=None)
    assert ours.render(conversation, tools=TOOLS) == expected
