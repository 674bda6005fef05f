"""IncrementalDetokenizer: streamed deltas add up to the one-shot decode, never a broken char."""

from __future__ import annotations

import random

import pytest

from semantic.text.detokenizer import IncrementalDetokenizer
from semantic.text.tokenizer import Tokenizer

TEXTS = [
    "Hello world! The quick brown fox.",
    "emoji 😀👍🏽 and 日本語 and naïve café",
    "def add(a, b):\n    return a + b\n",
    "<|im_start|>assistant\nhello!<|im_end|>\nafter",
    "   leading spaces and trailing   ",
]


def stream(tokenizer: Tokenizer, ids: list[int], *, skip_special_tokens: bool = True) -> list[str]:
    detok = IncrementalDetokenizer(tokenizer, skip_special_tokens=skip_special_tokens)
    deltas = [detok.push(token) for token in ids]
    return [*deltas, detok.flush()]


@pytest.mark.parametrize("text", TEXTS)
@pytest.mark.parametrize("skip_special_tokens", [True, False])
def test_deltas_concatenate_to_full_decode(
    tiny_tokenizer: Tokenizer, text: str, skip_special_tokens: bool
) -> None:
    ids = tiny_tokenizer.encode(text)
    deltas = stream(tiny_tokenizer, ids, skip_special_tokens=skip_special_tokens)
    assert "".join(deltas) == tiny_tokenizer.decode(ids, skip_special_tokens=skip_special_tokens)


def test_multibyte_character_split_across_tokens_is_held_back(tiny_tokenizer: Tokenizer) -> None:
    ids = tiny_tokenizer.encode("🦀")  # not in the training text: several byte tokens
    assert len(ids) > 1
    deltas = stream(tiny_tokenizer, ids)
    assert deltas == [""] * (len(ids) - 1) + ["🦀", ""]


def test_no_delta_ever_contains_a_replacement_character(tiny_tokenizer: Tokenizer) -> None:
    ids = tiny_tokenizer.encode("mixed 🦀 crab, 中文 and ünïcödé 🇫🇷")
    assert all("\ufffd" not in delta for delta in stream(tiny_tokenizer, ids))


def test_text_is_never_re_emitted(tiny_tokenizer: Tokenizer) -> None:
    ids = tiny_tokenizer.encode("one two three four five six seven")
    deltas = stream(tiny_tokenizer, ids)
    assert [d for d in deltas if d] == [tiny_tokenizer.decode([i]) for i in ids]


def test_special_tokens_are_skipped_by_default(tiny_tokenizer: Tokenizer) -> None:
    ids = tiny_tokenizer.encode("<|im_start|>hi<|im_end|>")
    assert "".join(stream(tiny_tokenizer, ids)) == "hi"


def test_unfinished_character_at_the_end_comes_out_of_flush(tiny_tokenizer: Tokenizer) -> None:
    ids = tiny_tokenizer.encode("ok\n🦀")[:-1]  # cut the crab's last byte
    detok = IncrementalDetokenizer(tiny_tokenizer)
    pushed = "".join(detok.push(token) for token in ids)
    assert pushed == "ok\n"
    assert pushed + detok.flush() == tiny_tokenizer.decode(ids)


def test_random_token_streams_match_full_decode(tiny_tokenizer: Tokenizer) -> None:
    rng = random.Random(0)
    for _ in range(50):
        ids = [rng.randrange(tiny_tokenizer.vocab_size) for _ in range(rng.randrange(1, 30))]
        assert "".join(stream(tiny_tokenizer, ids)) == tiny_tokenizer.decode(ids)
