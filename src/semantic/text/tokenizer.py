"""The model's tokenizer: text ⇄ token ids, from a `tokenizer.json` or from GGUF metadata.

A thin wrapper over the `tokenizers` library; it adds what the server needs to know about special
tokens (which ids end a sequence, which ids to hide from the output).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import tokenizers
from tokenizers import AddedToken, Regex, decoders, normalizers, pre_tokenizers
from tokenizers.models import BPE

from semantic.errors import ModelLoadFailed

# llama.cpp's `tokenizer.ggml.token_type` values.
_CONTROL = 3
_USER_DEFINED = 4

# How each llama.cpp pre-tokenizer (`tokenizer.ggml.pre`) splits text before BPE, where it differs
# from GPT-2's regex; the same regexes transformers' GGUF conversion uses.
_LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_PRE_TOKENIZER_SPLITS = {
    "llama3": _LLAMA3_SPLIT,
    "llama-v3": _LLAMA3_SPLIT,
    "llama-bpe": _LLAMA3_SPLIT,
    "smaug-bpe": _LLAMA3_SPLIT,
    "qwen2": _QWEN2_SPLIT,
    "deepseek-r1-qwen": _QWEN2_SPLIT,
}


class Tokenizer:
    """Encodes text with no special tokens added (chat templates write them) and decodes ids.

    `eos_token_ids` is every id that ends generation (the tokenizer's EOS plus the model's own
    list); `bos_token`/`eos_token` are the strings chat templates see.
    """

    def __init__(
        self,
        backend: tokenizers.Tokenizer,
        *,
        bos_token: str | None,
        eos_token: str | None,
        eos_token_ids: Iterable[int],
        add_bos: bool,
    ) -> None:
        self._backend = backend
        self.bos_token = bos_token
        self.eos_token = eos_token
        self.bos_token_id = backend.token_to_id(bos_token) if bos_token else None
        self.eos_token_ids = frozenset(eos_token_ids)
        self.add_bos = add_bos  # whether a raw (untemplated) prompt should start with BOS
        added = backend.get_added_tokens_decoder()
        self._special_ids = frozenset(i for i, token in added.items() if token.special)
        self._added_ids = frozenset(added)
        self._byte_level = isinstance(backend.decoder, decoders.ByteLevel)

    @classmethod
    def from_hf_dir(cls, path: Path, *, extra_eos_ids: Iterable[int] = ()) -> Tokenizer:
        """Read `tokenizer.json` and `tokenizer_config.json` from a Hugging Face directory."""
        tokenizer_file = path / "tokenizer.json"
        if not tokenizer_file.is_file():
            raise ModelLoadFailed(
                f"{path} has no tokenizer.json (only fast tokenizers are supported)"
            )
        backend = tokenizers.Tokenizer.from_file(str(tokenizer_file))
        config = _read_json(path / "tokenizer_config.json")
        bos, eos = _token_content(config.get("bos_token")), _token_content(config.get("eos_token"))
        eos_id = backend.token_to_id(eos) if eos else None
        add_bos = config.get("add_bos_token")
        if add_bos is None:
            # No flag: the post-processor decides, as it does for `tokenizer(text)` in transformers.
            bos_id = backend.token_to_id(bos) if bos else None
            add_bos = bos_id is not None and backend.encode("").ids[:1] == [bos_id]
        eos_ids = [*([] if eos_id is None else [eos_id]), *extra_eos_ids]
        return cls(backend, bos_token=bos, eos_token=eos, eos_token_ids=eos_ids, add_bos=add_bos)

    @classmethod
    def from_gguf(
        cls, metadata: Mapping[str, Any], *, extra_eos_ids: Iterable[int] = ()
    ) -> Tokenizer:
        """The tokenizer a GGUF describes in its (decoded) `tokenizer.*` metadata: byte-level
        BPE ("gpt2"), or Gemma's sentencepiece BPE ("llama" in a Gemma file)."""
        kind = metadata.get("tokenizer.ggml.model")
        tokens: list[str] = metadata["tokenizer.ggml.tokens"]
        if kind == "gpt2":
            backend = _byte_level_bpe(tokens, metadata["tokenizer.ggml.merges"])
            backend.pre_tokenizer = _gguf_pre_tokenizer(metadata.get("tokenizer.ggml.pre"))
        elif kind == "llama" and str(metadata.get("general.architecture")).startswith("gemma"):
            backend = gemma_sentencepiece(tokens)
        else:
            raise ModelLoadFailed(
                f"GGUF tokenizer model {kind!r} is not supported (byte-level BPE, 'gpt2', "
                "and Gemma's sentencepiece)"
            )
        ids = {key: metadata.get(f"tokenizer.ggml.{key}_token_id") for key in _GGUF_SPECIALS}
        types = metadata.get("tokenizer.ggml.token_type")
        _add_gguf_added_tokens(backend, tokens, types, ids, byte_level=kind == "gpt2")
        bos_id, eos_id = ids["bos"], ids["eos"]
        # EOT/EOM end a turn in Llama 3 style templates even where EOS is another token.
        eos_ids = [i for i in (eos_id, ids["eot"], ids["eom"], *extra_eos_ids) if i is not None]
        return cls(
            backend,
            bos_token=None if bos_id is None else tokens[bos_id],
            eos_token=None if eos_id is None else tokens[eos_id],
            eos_token_ids=eos_ids,
            add_bos=bool(metadata.get("tokenizer.ggml.add_bos_token", False)),
        )

    @property
    def vocab_size(self) -> int:
        return int(self._backend.get_vocab_size(with_added_tokens=True))

    def encode(self, text: str) -> list[int]:
        """Token ids of `text` with no BOS/EOS added; special tokens written in it stay whole.

        Through the batch call, which lets go of the GIL while it works (`encode` holds it: a
        9.5 MB prompt stalled every other request for 15 s), and skips the offsets nobody reads."""
        (encoding,) = self._backend.encode_batch_fast([text], add_special_tokens=False)
        return list(encoding.ids)

    def encode_with_ends(self, text: str) -> tuple[list[int], list[int]]:
        """`encode`'s token ids, and where in `text` each token ends (a character offset): how
        a place in the text is found among its tokens (`api/breakpoints.py`)."""
        (encoding,) = self._backend.encode_batch([text], add_special_tokens=False)
        return list(encoding.ids), [end for _, end in encoding.offsets]

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        return str(self._backend.decode(list(ids), skip_special_tokens=skip_special_tokens))

    def id_to_token(self, token_id: int) -> str | None:
        token = self._backend.id_to_token(token_id)
        return None if token is None else str(token)

    def token_to_id(self, token: str) -> int | None:
        token_id = self._backend.token_to_id(token)
        return None if token_id is None else int(token_id)

    def backend_json(self) -> str:
        """The whole tokenizer as `tokenizer.json` text (what grammar engines read)."""
        return self._backend.to_str()

    def is_special(self, token_id: int) -> bool:
        return token_id in self._special_ids

    def token_bytes(self, token_id: int) -> bytes:
        """The bytes one token puts in the text, as the OpenAI APIs' `bytes` show them: a
        byte-level token's bytes (a piece of a character, maybe), a sentencepiece byte
        token's one byte, an added token's own text; empty for an id outside the vocabulary."""
        token = self._backend.id_to_token(token_id)
        if token is None:
            return b""
        if token_id in self._added_ids:
            return str(token).encode()
        if self._byte_level and _in_byte_alphabet(token):
            return bytes(_BYTE_OF_CHAR[char] for char in token)
        byte = _SENTENCEPIECE_BYTE.fullmatch(token)
        if byte is not None:
            return bytes([int(byte.group(1), 16)])
        return str(token).replace("\u2581", " ").encode()


_GGUF_SPECIALS = ("bos", "eos", "unknown", "padding", "eot", "eom")
# A character byte-level BPE cannot produce: one outside its 256-character byte alphabet (a
# regex, because checking ~50K tokens a character set at a time costs every start ~15 ms).
_OUTSIDE_BYTE_ALPHABET = re.compile(
    "[^" + re.escape("".join(sorted(pre_tokenizers.ByteLevel.alphabet()))) + "]"
)


def _in_byte_alphabet(token: str) -> bool:
    return _OUTSIDE_BYTE_ALPHABET.search(token) is None


def _byte_alphabet() -> dict[str, int]:
    """GPT-2's byte-level alphabet: the character that stands for each byte (printable bytes
    stand for themselves, the others for 256 + n, in order)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAC + 1), *range(0xAE, 0xFF + 1)]
    others = [b for b in range(256) if b not in printable]
    chars = {b: chr(b) for b in printable} | {b: chr(256 + n) for n, b in enumerate(others)}
    return {char: byte for byte, char in chars.items()}


_BYTE_OF_CHAR = _byte_alphabet()
# Sentencepiece's byte fallback: a byte no piece holds is a token of its own, `<0x0A>`.
_SENTENCEPIECE_BYTE = re.compile(r"<0x([0-9A-Fa-f]{2})>")


def _byte_level_bpe(tokens: list[str], merges: list[str]) -> tokenizers.Tokenizer:
    """GPT-2 style BPE over the byte alphabet, the same model transformers builds for a GGUF."""
    respell = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    # A token written with characters outside the byte alphabet (a raw space, say) is respelled
    # into it, or BPE could never produce it.
    vocab = {
        token if _in_byte_alphabet(token) else respell.pre_tokenize_str(token)[0][0]: index
        for index, token in enumerate(tokens)
    }
    pairs = [(left, right) for left, _, right in (merge.partition(" ") for merge in merges)]
    model = BPE(vocab=vocab, merges=pairs, continuing_subword_prefix="", end_of_word_suffix="")
    backend = tokenizers.Tokenizer(model)
    backend.decoder = decoders.ByteLevel()
    return backend


def gemma_sentencepiece(tokens: list[str]) -> tokenizers.Tokenizer:
    """Gemma's sentencepiece BPE from a GGUF's vocabulary, built as transformers builds it: the
    file has no merges, so they are recovered from the vocabulary, best first in the order the
    tokens appear (Gemma's scores do not follow its merge order); spaces are `▁`, unknown
    bytes fall back to `<0xNN>` tokens. A token of only spaces is stored as real spaces and
    respelled with `▁` so its merges match."""
    spelled = ["\u2581" * len(t) if " " in t and not t.strip() else t for t in tokens]
    vocab = {token: index for index, token in enumerate(spelled)}
    merges: list[tuple[str, str, int]] = []
    for token, index in vocab.items():
        pairs = [(token[:i], token[i:]) for i in range(1, len(token))]
        found = [(left, right) for left, right in pairs if left in vocab and right in vocab]
        found.sort(key=lambda pair: (vocab[pair[0]], vocab[pair[1]]))
        merges += [(left, right, -index) for left, right in found]
    merges.sort(key=lambda m: (m[2], len(m[0]), len(m[1])), reverse=True)
    model = BPE(
        vocab=vocab,
        merges=[(left, right) for left, right, _ in merges],
        unk_token="<unk>",
        fuse_unk=True,
        byte_fallback=True,
    )
    backend = tokenizers.Tokenizer(model)
    backend.normalizer = normalizers.Replace(" ", "\u2581")
    backend.pre_tokenizer = pre_tokenizers.Split(" ", behavior="merged_with_previous")
    backend.decoder = decoders.Sequence(
        [decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse()]
    )
    return backend


def _gguf_pre_tokenizer(pre: str | None) -> pre_tokenizers.PreTokenizer:
    split = _PRE_TOKENIZER_SPLITS.get(pre or "")
    if split is None:
        # GPT-2's own regex. llama.cpp's "smollm" also splits digits one by one, but SmolLM2's
        # merges never join digits, so the ids are the same either way (as in transformers).
        return pre_tokenizers.ByteLevel(add_prefix_space=False)
    return pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(split), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )


def _add_gguf_added_tokens(
    backend: tokenizers.Tokenizer,
    tokens: list[str],
    token_types: list[int] | None,
    special_ids: Mapping[str, int | None],
    *,
    byte_level: bool,
) -> None:
    """Control tokens (and BOS/EOS/UNK/PAD) become special added tokens, user-defined tokens plain
    added ones: both must match whole in text instead of being cut into pieces by BPE."""
    types = token_types or []
    wanted = {i for i, kind in enumerate(types) if kind == _CONTROL}
    wanted |= {i for i in special_ids.values() if i is not None}
    # A "control" token spelled outside the byte alphabet is a llama.cpp mislabel; adding it would
    # grow the vocabulary past the model's embedding, so it is skipped (as transformers does).
    control = [tokens[i] for i in sorted(wanted) if not byte_level or _in_byte_alphabet(tokens[i])]
    backend.add_special_tokens([AddedToken(t, normalized=False, special=True) for t in control])
    if _USER_DEFINED not in types:
        return
    vocab = backend.get_vocab()
    user = [
        t for t, kind in zip(tokens, types, strict=True) if kind == _USER_DEFINED and t in vocab
    ]
    backend.add_tokens([AddedToken(t, normalized=False, special=False) for t in user])


def _read_json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    data: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    return data


def _token_content(token: str | dict[str, Any] | None) -> str | None:
    """`tokenizer_config.json` writes a special token as a string or as a serialized AddedToken."""
    if isinstance(token, dict):
        return str(token["content"])
    return token
