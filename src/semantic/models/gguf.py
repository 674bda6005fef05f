"""Reading a GGUF file: its metadata as a `ModelConfig`, its tensors as Hugging Face-named float32
(or, where a backend computes on them, Q4_K, Q6_K and the per-32 types' tensors as their unpacked
blocks: `models/q4k.py`, `models/q6k.py`, `models/q32.py`).

Quantized tensors are dequantized with the `gguf` package (every type it knows: Q4_K, Q5_0,
Q6_K, Q8_0, MXFP4, …); llama.cpp's converter renames tensors (per architecture), reorders
Llama's Q/K rows, stores Gemma's norms as `1 + w` and Phi-3's LongRoPE factors as tensors, and
all of it is undone here so backends see one naming and layout. What a GGUF does not say (Gemma
3's layer pattern and local rope base, GPT-OSS's alternation, Qwen3 MoE's renormalised routing,
SmolLM3's rope-less layers) is what llama.cpp assumes for the architecture. Each of these is a
rule of the family's record (`models/families/`: `GGUFRules`); this file applies them.
"""

from __future__ import annotations

import functools
import struct
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any, Literal, overload

import numpy as np
from gguf import GGMLQuantizationType, quants

from semantic.core import DefaultSampling
from semantic.errors import ModelLoadFailed
from semantic.models.config import ModelConfig, complete_longrope
from semantic.models.families import family_of_gguf, supported_gguf_architectures
from semantic.models.families.family import GGUFRules
from semantic.models.fingerprint import WeightsFile, fingerprint
from semantic.models.gguf_reader import GGUFLayout, TensorInfo
from semantic.models.q4k import read_q4k, read_q5k
from semantic.models.q6k import Blocks, read_q6k
from semantic.models.q32 import READERS as Q32_READERS

# Phi-3's LongRoPE factor lists, kept as tensors: read into the config, not weights.
_LONGROPE_TENSORS = {
    "rope_factors_long.weight": "long_factor",
    "rope_factors_short.weight": "short_factor",
}

# What a file may recommend for sampling, as llama.cpp's converter writes it.
_SAMPLING_KEYS = {
    "general.sampling.temp": "temperature",
    "general.sampling.top_p": "top_p",
    "general.sampling.top_k": "top_k",
    "general.sampling.penalty_repeat": "repetition_penalty",
}

_GLOBAL_TENSORS = {
    "token_embd": "model.embed_tokens",
    "output_norm": "model.norm",
    "output": "lm_head",
}
_LAYER_TENSORS = {
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
_UNSUFFIXED = frozenset({"self_attn.sinks"})  # a parameter of its own, not a module's weight


class GGUFFile:
    """One opened GGUF file. The tensors stay memory-mapped until `weights()` reads them, one at
    a time, so loading never holds a second full copy of the model."""

    def __init__(self, path: Path) -> None:
        try:
            self._reader = GGUFLayout(path)
        except (OSError, ValueError, IndexError, KeyError, struct.error) as exc:  # truncated
            raise ModelLoadFailed(f"{path} is not a readable GGUF file: {exc}") from exc
        self.path = path
        # Decoded once (gguf_reader.py): ~0.2 s for a 262K-token vocabulary, the rest is tiny.
        self.metadata: dict[str, Any] = self._reader.fields
        self.architecture = str(self.metadata.get("general.architecture"))
        family = family_of_gguf(self.architecture)
        if family is None or family.gguf is None:
            raise ModelLoadFailed(
                f"{path}: GGUF architecture {self.architecture!r} is not supported "
                f"(supported: {', '.join(supported_gguf_architectures())})"
            )
        self.model_type = family.name
        self.rules: GGUFRules = family.gguf

    @property
    def tensor_names(self) -> frozenset[str]:
        return frozenset(t.name for t in self._reader.tensors)

    @property
    def num_tensors(self) -> int:
        return len(self._reader.tensors)

    def fingerprint(self) -> str:
        """The weights' fingerprint: the header (metadata and tensor table) and samples of every
        tensor's bytes."""
        tensors = [(t.offset, t.offset + t.data.nbytes) for t in self._reader.tensors]
        return fingerprint([WeightsFile(self.path, self._reader.data_offset, tensors)])

    @property
    def chat_template(self) -> str | None:
        template = self.metadata.get("tokenizer.chat_template")
        return str(template) if template else None

    @property
    def sampling(self) -> DefaultSampling | None:
        """The sampling the file recommends (llama.cpp's `general.sampling.*` keys), if any."""
        return DefaultSampling.recommended(
            {field: self.metadata.get(key) for key, field in _SAMPLING_KEYS.items()}
        )

    def config(self) -> ModelConfig:
        """The architecture from `<arch>.*` metadata, named as in Hugging Face `config.json`,
        completed by the family's rules."""
        names = self.tensor_names
        heads = self.arch("attention.head_count")
        hidden = self.arch("embedding_length")
        layers = self.arch("block_count")
        rotary_dim = self.arch("rope.dimension_count", None)
        head_dim = (
            self.arch("attention.key_length", None)
            or (rotary_dim if self.rules.head_dim_from_rope else None)
            or hidden // heads
        )
        fields: dict[str, Any] = {
            "model_type": self.model_type,
            "vocab_size": self.arch("vocab_size", None)
            or len(self.metadata["tokenizer.ggml.tokens"]),
            "hidden_size": hidden,
            "intermediate_size": self.arch("feed_forward_length", None),
            "num_hidden_layers": layers,
            "num_attention_heads": heads,
            "num_key_value_heads": self.arch("attention.head_count_kv", None) or heads,
            "head_dim": head_dim,
            "max_position_embeddings": self.arch("context_length"),
            "rms_norm_eps": self.arch("attention.layer_norm_rms_epsilon", 1e-6),
            "rope_theta": self.arch("rope.freq_base", 10000.0),
            "rope_scaling": self._rope_scaling(names),
            "partial_rotary_factor": (rotary_dim or head_dim) / head_dim,
            "tie_word_embeddings": "output.weight" not in names,
            "attention_bias": "blk.0.attn_q.bias" in names,
            "bos_token_id": self.metadata.get("tokenizer.ggml.bos_token_id"),
            "eos_token_ids": self._end_token_ids(),
            "layer_types": self._layer_types(layers),
            "sliding_window": self.arch("attention.sliding_window", None),
        }
        fields.update(self.rules.fields(self, fields))
        if fields["intermediate_size"] is None:
            raise ModelLoadFailed(
                f"{self.path}: GGUF metadata lacks {self.architecture}.feed_forward_length"
            )
        return ModelConfig(**fields)

    def _end_token_ids(self) -> tuple[int, ...]:
        special = [self.metadata.get(f"tokenizer.ggml.{k}_token_id") for k in ("eos", "eot", "eom")]
        return tuple(dict.fromkeys(i for i in special if i is not None))

    def _layer_types(self, layers: int) -> tuple[str, ...]:
        if self.arch("attention.sliding_window", None) is None:
            return ()
        return self.rules.layer_types(layers)

    @overload
    def weights(
        self, config: ModelConfig, *, blocks: Literal[False] = False
    ) -> Iterator[tuple[str, np.ndarray]]: ...

    @overload
    def weights(
        self, config: ModelConfig, *, blocks: bool
    ) -> Iterator[tuple[str, np.ndarray | Blocks]]: ...

    def weights(
        self, config: ModelConfig, *, blocks: bool = False
    ) -> Iterator[tuple[str, np.ndarray | Blocks]]:
        """Every tensor, dequantized to float32, in Hugging Face's name and layout; with
        `blocks`, the matrices in a block type a backend computes on (Q4_K, Q5_K, Q6_K, Q4_0,
        Q4_1, Q5_0, Q5_1, Q8_0) that need no fix-up but a row order come as their blocks
        (`Q4KBlocks`, `Q6KBlocks`, `Q32Blocks`), in the architectures whose backends take their
        linears whole."""
        keep = blocks and self._keeps_blocks(config)
        for tensor in self._reader.tensors:
            if tensor.name in _LONGROPE_TENSORS:
                continue  # in the config's rope scaling
            name = hf_tensor_name(tensor.name, self.rules.tensor_names)
            # GGUF lists dims innermost first; numpy wants them outermost first.
            shape = tuple(reversed(tensor.shape))
            read = _BLOCK_READERS.get(tensor.tensor_type) if len(shape) == 2 else None
            if keep and read is not None:
                rows, cols = shape
                unpermute = functools.partial(self._undo_rope_permute, name, config=config)
                yield name, read(tensor.data, rows, cols).with_rows(unpermute)
                continue
            array = quants.dequantize(tensor.data, tensor.tensor_type).reshape(shape)
            # A copy we own: F32 tensors come back as read-only views of the memory map.
            array = np.require(array, dtype=np.float32, requirements=["C", "W"])
            if self.rules.norm_plus_one and name.endswith("norm.weight"):
                array -= 1.0
            yield name, self._undo_rope_permute(name, array, config)

    def has_blocks(self, config: ModelConfig) -> bool:
        """Whether `weights(blocks=True)` yields any blocks."""
        return self._keeps_blocks(config) and any(map(_is_block_matrix, self._reader.tensors))

    def has_k_blocks(self) -> bool:
        """Whether the file holds any Q4_K or Q5_K matrix (a Q4_K_M or Q5_K_M file, say)."""
        return any(map(_is_k_matrix, self._reader.tensors))

    def _keeps_blocks(self, config: ModelConfig) -> bool:
        # Rope over whole heads: no head's dims are reordered (`names.rotary_rows`).
        return self.rules.blocks_kept and config.rotary_dim == config.head_dim

    def arch(self, key: str, default: Any = ...) -> Any:
        """The architecture's `<arch>.<key>` metadata; without a default, a load failure where
        the file lacks it."""
        value = self.metadata.get(f"{self.architecture}.{key}", default)
        if value is ...:
            raise ModelLoadFailed(f"{self.path}: GGUF metadata lacks {self.architecture}.{key}")
        return value

    def _rope_scaling(self, names: frozenset[str]) -> dict[str, Any] | None:
        if names & _LONGROPE_TENSORS.keys():
            return self._longrope()
        kind = self.arch("rope.scaling.type", None)
        if kind in (None, "none"):
            return None
        scaling: dict[str, Any] = {"rope_type": kind, "factor": self.arch("rope.scaling.factor")}
        original = self.arch("rope.scaling.original_context_length", None)
        if original is not None:
            scaling["original_max_position_embeddings"] = original
        return scaling

    def _longrope(self) -> dict[str, Any] | None:
        """Phi-3's LongRoPE as its config says it: both factor lists (tensors here), the
        original context, and the scale on cos and sin the converter computed from them."""
        tensors = {t.name: t for t in self._reader.tensors if t.name in _LONGROPE_TENSORS}
        if len(tensors) != len(_LONGROPE_TENSORS):
            raise ModelLoadFailed(f"{self.path}: GGUF has one of LongRoPE's factor lists only")
        scaling: dict[str, Any] = {"rope_type": "longrope"}
        for name, tensor in tensors.items():
            factors = quants.dequantize(tensor.data, tensor.tensor_type)
            scaling[_LONGROPE_TENSORS[name]] = [float(f) for f in factors.reshape(-1)]
        attention_factor = self.arch("rope.scaling.attn_factor", None)
        if attention_factor is not None:
            scaling["attention_factor"] = float(attention_factor)
        original = self.arch("rope.scaling.original_context_length")
        context = self.arch("context_length")
        return complete_longrope(scaling, context, {"original_max_position_embeddings": original})

    def _undo_rope_permute(self, name: str, array: np.ndarray, config: ModelConfig) -> np.ndarray:
        if not self.rules.q_k_permuted:
            return array
        if name.endswith("q_proj.weight"):
            return unpermute_rope_rows(array, config.num_attention_heads)
        if name.endswith("k_proj.weight"):
            return unpermute_rope_rows(array, config.num_key_value_heads)
        return array


_BLOCK_READERS: dict[GGMLQuantizationType, Callable[[np.ndarray, int, int], Blocks]] = {
    GGMLQuantizationType.Q4_K: read_q4k,
    GGMLQuantizationType.Q5_K: read_q5k,
    GGMLQuantizationType.Q6_K: read_q6k,
    **{GGMLQuantizationType[name]: read for name, read in Q32_READERS.items()},
}


# a scale and a min per group of 32 (`Q4KBlocks`): what makes "auto" weights "gguf"
_K_TYPES = (GGMLQuantizationType.Q4_K, GGMLQuantizationType.Q5_K)


def _is_block_matrix(tensor: TensorInfo) -> bool:
    return tensor.tensor_type in _BLOCK_READERS and len(tensor.shape) == 2


def _is_k_matrix(tensor: TensorInfo) -> bool:
    return tensor.tensor_type in _K_TYPES and len(tensor.shape) == 2


def hf_tensor_name(gguf_name: str, family_names: Mapping[str, str] | None = None) -> str:
    """`blk.3.attn_q.weight` → `model.layers.3.self_attn.q_proj.weight`, and so on, with the
    family's own names where they differ (`GGUFRules.tensor_names`)."""
    base, _, suffix = gguf_name.rpartition(".")
    parts = base.split(".")
    names = {**_LAYER_TENSORS, **(family_names or {})}
    if parts[0] == "blk" and len(parts) == 3 and parts[2] in names:
        hf_name = names[parts[2]]
        if hf_name in _UNSUFFIXED:
            return f"model.layers.{parts[1]}.{hf_name}"
        return f"model.layers.{parts[1]}.{hf_name}.{suffix}"
    if base in _GLOBAL_TENSORS:
        return f"{_GLOBAL_TENSORS[base]}.{suffix}"
    # e.g. rope_freqs (Llama 3.1 rope scaling), which our model code cannot use yet.
    raise ModelLoadFailed(f"GGUF tensor {gguf_name!r} is not supported")


def unpermute_rope_rows(weight: np.ndarray, num_heads: int) -> np.ndarray:
    """Undo convert_hf_to_gguf's `permute` of a Q or K projection: `weight: [heads*head_dim, in]`.

    llama.cpp's RoPE rotates adjacent pairs (2i, 2i+1), Hugging Face's rotates (i, i + head_dim/2),
    so the converter interleaves each head's two halves; this puts them back.
    """
    half = weight.shape[0] // num_heads // 2
    per_head = weight.reshape(num_heads, half, 2, *weight.shape[1:])
    return per_head.swapaxes(1, 2).reshape(weight.shape)
