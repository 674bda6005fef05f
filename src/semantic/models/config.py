"""The architecture of a checkpoint, in Hugging Face's terms, whatever file it came from. What
is particular to a family (its defaults, derived layer types, rope-less layers) is read from
its record (`models/families/`)."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from semantic.errors import ModelLoadFailed
from semantic.models.families import family_of
from semantic.models.families.family import FULL_ATTENTION, SLIDING_ATTENTION, ConfigRules

__all__ = ["FULL_ATTENTION", "SLIDING_ATTENTION", "ModelConfig"]

# The rules of a model_type no family claims (the backends refuse to build it).
_UNKNOWN_FAMILY = ConfigRules()


@dataclass(slots=True, frozen=True)
class ModelConfig:
    """Hyperparameters of a decoder-only transformer, named as in Hugging Face `config.json`.

    Loaders fill this from `config.json` or from GGUF metadata; backends build their model code
    from it. `rope_scaling` is kept as Hugging Face writes it (e.g. Llama 3's `rope_type: llama3`).
    LongRoPE's (Phi-3) is completed as it is read: its `original_max_position_embeddings` and
    `factor` always set, and `long` saying which factor list rotates (`within_context`). Rope
    rotates the first `rotary_dim` dims of each head (`partial_rotary_factor`, Phi-4-mini's 0.75)
    and passes the rest through. `layer_types` names each layer's attention (`full_attention` or
    `sliding_attention`, whose window is `sliding_window`); empty means full attention
    everywhere. `no_rope_layers` says which layers rotate q and k (SmolLM3: 1 rope, 0 none,
    "NoPE"); empty means all do. The fields after it are read only by the families that have
    them (Gemma 3, GPT-OSS, Qwen3 MoE); `model_type` picks the family. The expert counts (and
    the NoPE list's length) are checked here, before any layer is sized by them.
    """

    model_type: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    max_position_embeddings: int
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_scaling: dict[str, Any] | None = None
    partial_rotary_factor: float = 1.0
    tie_word_embeddings: bool = False
    attention_bias: bool = False
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = field(default_factory=tuple)
    layer_types: tuple[str, ...] = ()
    sliding_window: int | None = None
    no_rope_layers: tuple[int, ...] = ()
    hidden_act: str = "silu"
    query_pre_attn_scalar: float | None = None  # Gemma: q · this^-0.5 instead of head_dim^-0.5
    rope_local_theta: float | None = None  # Gemma 3: the sliding layers' own rope base
    num_local_experts: int = 0  # MoE: experts per sparse layer, and how many each token uses
    num_experts_per_tok: int = 0
    norm_topk_prob: bool = False  # Qwen3 MoE: the chosen experts' weights renormalised to sum 1
    decoder_sparse_step: int = 1  # Qwen3 MoE: every n-th layer is sparse, but those listed in
    mlp_only_layers: tuple[int, ...] = ()  # `mlp_only_layers`, which keep a dense MLP
    swiglu_limit: float = 7.0  # GPT-OSS: its experts' clamp on gate and up, and gate's slope
    swiglu_alpha: float = 1.702
    attn_logit_softcapping: float | None = None  # Gemma 2 only: refused (Gemma 3 has none)
    final_logit_softcapping: float | None = None
    # What one family reads from its config that no other has (config.json's name and value),
    # for its own weight fix-ups (`ConfigRules.fields`).
    extras: tuple[tuple[str, Any], ...] = ()

    def __post_init__(self) -> None:
        if self.num_local_experts < 0 or self.decoder_sparse_step < 1:
            raise ModelLoadFailed(
                f"num_local_experts ({self.num_local_experts}) must be at least 0 and "
                f"decoder_sparse_step ({self.decoder_sparse_step}) at least 1"
            )
        if self.num_local_experts and not 1 <= self.num_experts_per_tok <= self.num_local_experts:
            raise ModelLoadFailed(
                f"num_experts_per_tok ({self.num_experts_per_tok}) must be between 1 and "
                f"num_local_experts ({self.num_local_experts})"
            )
        if self.no_rope_layers and len(self.no_rope_layers) < self.num_hidden_layers:
            raise ModelLoadFailed(
                f"no_rope_layers names {len(self.no_rope_layers)} layers, not "
                f"num_hidden_layers ({self.num_hidden_layers})"
            )

    @property
    def rotary_dim(self) -> int:
        """The dims of each head that rope rotates (the first ones; the rest pass through)."""
        return int(self.head_dim * self.partial_rotary_factor)

    @property
    def rope_variant(self) -> str | None:
        """What rotated keys depend on beyond the checkpoint, for the cache's tag: LongRoPE's
        factor list ("longrope-long" or "longrope-short"); None where nothing does."""
        scaling = self.rope_scaling
        if scaling is None or not is_longrope(scaling):
            return None
        return "longrope-long" if scaling.get("long") else "longrope-short"

    def within_context(self, context: int) -> ModelConfig:
        """This config served with sequences of at most `context` tokens: LongRoPE rotates by
        its long factors where that passes the original context, by its short ones elsewhere,
        whatever length a sequence has reached (`docs/models.md` says why)."""
        scaling = self.rope_scaling
        if scaling is None or not is_longrope(scaling):
            return self
        long = context > scaling["original_max_position_embeddings"]
        return replace(self, rope_scaling={**scaling, "long": long})

    def layer_has_experts(self, layer: int) -> bool:
        """Whether a layer's feed-forward is a mixture of experts (else a dense MLP)."""
        sparse = (layer + 1) % self.decoder_sparse_step == 0
        return self.num_local_experts > 0 and sparse and layer not in self.mlp_only_layers

    def layer_window(self, layer: int) -> int | None:
        """The sliding window of a layer (keys a query sees, itself included); None: all."""
        if not self.layer_types or self.layer_types[layer] != SLIDING_ATTENTION:
            return None
        window = self.sliding_window
        # A window that holds the whole context is none (Phi-3-mini-128k's 262,144).
        return window if window is None or window < self.max_position_embeddings else None

    def extra(self, name: str, default: Any) -> Any:
        """A value of `extras`, or `default` where the config left it out."""
        return dict(self.extras).get(name, default)

    def layer_has_rope(self, layer: int) -> bool:
        """Whether a layer rotates its queries and keys (else it attends by content alone)."""
        return not self.no_rope_layers or bool(self.no_rope_layers[layer])

    @classmethod
    def from_hf(cls, config: dict[str, Any]) -> ModelConfig:
        """Read a parsed Hugging Face `config.json`; a multimodal one's `text_config`."""
        if isinstance(config.get("text_config"), dict):
            config = {**_outer_defaults(config), **config["text_config"]}
        model_type = config.get("model_type", "llama")
        family = family_of(model_type)
        if family is not None and model_type in family.aliases:
            model_type = family.name
        rules = family.config if family is not None else _UNKNOWN_FAMILY
        heads = config["num_attention_heads"]
        layers = config["num_hidden_layers"]
        context = config.get("max_position_embeddings", 2048)
        rope = _RopeSettings.read(config, rules)
        eos = config.get("eos_token_id")
        eos_ids = tuple(eos) if isinstance(eos, list) else (() if eos is None else (eos,))
        read = cls(
            model_type=model_type,
            vocab_size=config["vocab_size"],
            hidden_size=config["hidden_size"],
            intermediate_size=config["intermediate_size"],
            num_hidden_layers=layers,
            num_attention_heads=heads,
            num_key_value_heads=config.get("num_key_value_heads") or heads,
            head_dim=config.get("head_dim") or config["hidden_size"] // heads,
            max_position_embeddings=context,
            rms_norm_eps=config.get("rms_norm_eps", 1e-6),
            rope_theta=rope.theta,
            rope_scaling=complete_longrope(rope.scaling, context, config),
            partial_rotary_factor=rope.partial_rotary_factor,
            tie_word_embeddings=config.get("tie_word_embeddings", rules.tied_embeddings),
            attention_bias=config.get("attention_bias", rules.attention_bias),
            bos_token_id=config.get("bos_token_id"),
            eos_token_ids=eos_ids,
            layer_types=_layer_types(config, rules, layers),
            sliding_window=config.get("sliding_window"),
            no_rope_layers=rules.no_rope_layers(config, layers) if rules.no_rope_layers else (),
            hidden_act=config.get("hidden_activation") or config.get("hidden_act") or "silu",
            query_pre_attn_scalar=config.get("query_pre_attn_scalar"),
            rope_local_theta=rope.local_theta,
            # Qwen3 MoE's config.json says `num_experts`; transformers saves it under this name.
            num_local_experts=config.get("num_local_experts") or config.get("num_experts") or 0,
            num_experts_per_tok=config.get("num_experts_per_tok", 0),
            norm_topk_prob=bool(config.get("norm_topk_prob", False)),
            decoder_sparse_step=config.get("decoder_sparse_step") or 1,
            mlp_only_layers=tuple(config.get("mlp_only_layers") or ()),
            swiglu_limit=config.get("swiglu_limit", 7.0),
            swiglu_alpha=config.get("swiglu_alpha", 1.702),
            attn_logit_softcapping=config.get("attn_logit_softcapping"),
            final_logit_softcapping=config.get("final_logit_softcapping"),
        )
        family_fields = rules.fields(config)
        return replace(read, **family_fields) if family_fields else read


def _outer_defaults(config: dict[str, Any]) -> dict[str, Any]:
    """What a multimodal config says beside its `text_config` that the text model uses."""
    keys = ("tie_word_embeddings", "eos_token_id", "bos_token_id")
    return {key: config[key] for key in keys if key in config}


@dataclass(slots=True, frozen=True)
class _RopeSettings:
    theta: float
    scaling: dict[str, Any] | None
    local_theta: float | None
    partial_rotary_factor: float

    @classmethod
    def read(cls, config: dict[str, Any], rules: ConfigRules) -> _RopeSettings:
        # transformers 5 writes RoPE settings as one `rope_parameters` object, or one per layer
        # type (Gemma 3); older configs have `rope_theta`, `rope_scaling` and Gemma 3's
        # `rope_local_base_freq` beside the rest.
        rope = dict(config.get("rope_parameters") or {})
        local = config.get("rope_local_base_freq")
        if FULL_ATTENTION in rope or SLIDING_ATTENTION in rope:
            local = (rope.get(SLIDING_ATTENTION) or {}).get("rope_theta", local)
            rope = dict(rope.get(FULL_ATTENTION) or {})
        theta = rope.pop("rope_theta", None) or config.get("rope_theta") or rules.rope_theta
        partial = rope.pop("partial_rotary_factor", None) or config.get("partial_rotary_factor")
        scaling = config.get("rope_scaling") or (
            rope if rope.get("rope_type", "default") != "default" else None
        )
        kind = (scaling or {}).get("rope_type", (scaling or {}).get("type"))
        # Older configs name LongRoPE `su` (Phi-3's also `yarn`), as transformers still reads.
        if kind == "su" or (rules.yarn_is_longrope and kind == "yarn"):
            scaling = {**(scaling or {}), "rope_type": "longrope"}
        return cls(theta, scaling, local, float(partial or 1.0))


def is_longrope(scaling: dict[str, Any]) -> bool:
    return bool(scaling.get("rope_type", scaling.get("type")) == "longrope")


def complete_longrope(
    scaling: dict[str, Any] | None, context: int, config: dict[str, Any]
) -> dict[str, Any] | None:
    """LongRoPE's settings as transformers completes them: the original context from the
    config's top level first (Phi-3 keeps it there), `factor` the context's ratio to it unless
    given; `long` as the model's own context chooses (`within_context` changes it)."""
    if scaling is None or not is_longrope(scaling):
        return scaling
    original = config.get("original_max_position_embeddings") or scaling.get(
        "original_max_position_embeddings", context
    )
    if original < 2:  # its logarithm divides LongRoPE's scale
        raise ModelLoadFailed(f"LongRoPE's original context {original} is not a context")
    factor = scaling.get("factor") or context / original
    completed = {**scaling, "rope_type": "longrope", "factor": factor}
    return {**completed, "original_max_position_embeddings": original, "long": context > original}


def _layer_types(config: dict[str, Any], rules: ConfigRules, layers: int) -> tuple[str, ...]:
    """Each layer's attention, from `layer_types`, or as the family derives it in configs
    written before that field existed; () when every layer attends to everything."""
    types = config.get("layer_types")
    window = config.get("sliding_window")
    if types is None and window is not None:
        types = [rules.layer_type(config, i) for i in range(layers)]
    if not types or window is None or SLIDING_ATTENTION not in types:
        return ()
    return tuple(types)
