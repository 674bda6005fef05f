"""The domain nouns every layer shares: requests, sequences, batches, events, cache geometry.

Standard library only: the engine's pure core and the HTTP layer both import this file.
"""

from __future__ import annotations

import enum
import math
import re
import time
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

# Agent ids name files on disk later: letters, digits, '-', '_', '.', never a leading dot.
AGENT_ID_PATTERN = r"^[A-Za-z0-9_-][A-Za-z0-9._-]{0,127}$"


def is_valid_agent_id(agent_id: str) -> bool:
    return re.fullmatch(AGENT_ID_PATTERN, agent_id) is not None


def first_read_block(window: int | None, num_tokens: int, block_tokens: int) -> int:
    """The first block the next token reads once a sequence has `num_tokens` tokens of KV: 0
    for full attention; for a sliding window, the block of the first key in it (the token at
    position p reads keys p - window + 1 .. p)."""
    if window is None:
        return 0
    return max(0, num_tokens - window + 1) // block_tokens


# KV dtypes stored quantized (`CacheSpec.kv_dtype`), each row with a scale of this many bytes.
KV_QUANTIZED = ("int8",)
KV_SCALE_BYTES = 2


@dataclass(slots=True, frozen=True)
class LayerGroup:
    """Layers whose K/V for a block share one page of the pool: layers of one kind of attention
    (`window` None: full attention, else the sliding window they read), so a page is needed
    exactly as long as any of them reads the block."""

    layers: tuple[int, ...]
    window: int | None


@dataclass(slots=True, frozen=True)
class AgentKey:
    """An agent's identity: the id its client chose, within the scope of its owner, a digest of
    the API key that made it (None on a server without keys, and for agents made before
    agents had owners). Two keys that choose one id have two agents."""

    agent_id: str
    owner: str | None = None


@dataclass(slots=True, frozen=True)
class Caller:
    """Who asks about agents: their `owner` scope (as in `AgentKey`), and whether they may see
    and reach every owner's agents (an admin key, or anyone on a server without keys)."""

    owner: str | None
    admin: bool


class KVGeometry(Protocol):
    """What a model's config says of its KV cache (`models/config.py: ModelConfig` has it)."""

    @property
    def num_hidden_layers(self) -> int: ...
    @property
    def num_key_value_heads(self) -> int: ...
    @property
    def head_dim(self) -> int: ...
    @property
    def rope_variant(self) -> str | None: ...


@dataclass(slots=True, frozen=True)
class CacheSpec:
    """The geometry of one model's KV cache: what a block holds and how big it is.

    Cache files and prefix hashes are tagged with `tag()`, so a cache written for one geometry is
    never read into another. `layer_windows` gives each layer's attention: None for full
    attention, else the sliding window it reads (empty: full attention in every layer).
    `kv_dtype` is how the pool stores K and V: None in `dtype`, the model's; "int8" as 8-bit
    integers with a bf16 scale per token and KV head, about half the bytes
    (`backends/torch/int8.py` says why these scales). `rope_variant` names what the keys'
    rotation depends on beyond the weights (LongRoPE's factor list, which the served context
    picks: `ModelConfig.rope_variant`), None where nothing does.

    The layers fall into `groups` of `layers_per_group` layers of one kind each (every layer in
    one group when they are all alike): a block of a sequence takes one page of the pool per
    group, and a sliding group's page is released once the block has left its window. The
    groups are equal in size (the greatest common divisor of each kind's layer count), so the
    pool hands out pages of one size to every group; full-attention groups come first.
    """

    num_layers: int
    num_kv_heads: int
    head_dim: int
    dtype: str  # "bfloat16" | "float16" | "float32"
    block_tokens: int
    layer_windows: tuple[int | None, ...] = ()
    kv_dtype: str | None = None  # None: K/V in `dtype`; "int8": quantized, see above
    rope_variant: str | None = None
    groups: tuple[LayerGroup, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.kv_dtype not in (None, *KV_QUANTIZED):
            raise ValueError(f"unknown KV dtype {self.kv_dtype!r}")
        if self.layer_windows and len(self.layer_windows) != self.num_layers:
            raise ValueError("layer_windows must name every layer's attention, or none")
        object.__setattr__(self, "groups", _layer_groups(self.num_layers, self.layer_windows))

    @classmethod
    def of_model(
        cls,
        config: KVGeometry,
        layer_windows: tuple[int | None, ...],
        *,
        dtype: str,
        block_tokens: int,
        kv_dtype: str | None,
    ) -> CacheSpec:
        """The cache of a model as a runner built it: the config's KV heads, head size and rope
        variant, each layer's window as the built model reads it (none named where every
        layer reads everything), K and V stored in `kv_dtype` (None: the model's `dtype`)."""
        return cls(
            num_layers=config.num_hidden_layers,
            num_kv_heads=config.num_key_value_heads,
            head_dim=config.head_dim,
            dtype=dtype,
            block_tokens=block_tokens,
            layer_windows=layer_windows if any(w is not None for w in layer_windows) else (),
            kv_dtype=kv_dtype,
            rope_variant=config.rope_variant,
        )

    @property
    def sliding_windows(self) -> tuple[int, ...]:
        """The distinct windows of the sliding layers, smallest first."""
        return tuple(sorted({w for w in self.layer_windows if w is not None}))

    @property
    def group_windows(self) -> tuple[int | None, ...]:
        return tuple(group.window for group in self.groups)

    @property
    def layers_per_group(self) -> int:
        return len(self.groups[0].layers)

    @property
    def dtype_bytes(self) -> int:
        return 4 if self.dtype == "float32" else 2

    @property
    def bytes_per_page(self) -> int:
        """K and V of one group's layers for one block: what the pool hands out."""
        return self.bytes_per_block // len(self.groups)

    def whole_blocks(self, num_pages: int) -> int:
        """Blocks of every layer (a page of each group) that `num_pages` pages hold."""
        return num_pages // len(self.groups)

    @property
    def row_bytes(self) -> int:
        """One token's K (or V) of one KV head in the pool: head_dim values, and with a
        quantized cache their scale."""
        if self.kv_dtype is None:
            return self.head_dim * self.dtype_bytes
        return self.head_dim + KV_SCALE_BYTES

    @property
    def bytes_per_block(self) -> int:
        """K and V for every layer of one block (a page of every group)."""
        per_layer = self.block_tokens * self.num_kv_heads * self.row_bytes
        return 2 * self.num_layers * per_layer

    def tag(self) -> str:
        # An 8-bit cache says so after the dtype; the tags of unquantized caches are unchanged.
        stored = f"{self.dtype}-kv{self.kv_dtype}" if self.kv_dtype else self.dtype
        base = (
            f"L{self.num_layers}-kv{self.num_kv_heads}-d{self.head_dim}"
            f"-{stored}-b{self.block_tokens}"
        )
        if self.rope_variant:  # keys rotated otherwise are other keys
            base = f"{base}-{self.rope_variant}"
        if not self.sliding_windows:
            return base  # the tag of every full-attention cache written before windows existed
        # Pages of several groups: a file holds one group's layers (caches written before the
        # groups held every layer in a file, under the tag without this suffix).
        paged = f"-g{len(self.groups)}" if len(self.groups) > 1 else ""
        if len(self.sliding_windows) > 1:  # rare: every layer's window (0: full)
            return f"{base}-sw" + ".".join(str(w or 0) for w in self.layer_windows) + paged
        # Which layers slide: a bit per layer, so two patterns never share a tag.
        pattern = sum(1 << i for i, w in enumerate(self.layer_windows) if w is not None)
        return f"{base}-sw{self.sliding_windows[0]}x{pattern:x}{paged}"


def _layer_groups(num_layers: int, layer_windows: tuple[int | None, ...]) -> tuple[LayerGroup, ...]:
    """Each kind of attention's layers (full first, then windows smallest first) in groups of
    the greatest common divisor of the kinds' layer counts: one group when all layers are
    alike; Gemma 3 270M's 3 global and 15 sliding layers make 6 groups of 3."""
    windows = layer_windows or (None,) * num_layers
    kinds: dict[int | None, list[int]] = {}
    for window in sorted(set(windows), key=lambda w: -1 if w is None else w):
        kinds[window] = [i for i, w in enumerate(windows) if w == window]
    size = math.gcd(*(len(layers) for layers in kinds.values()))
    return tuple(
        LayerGroup(tuple(layers[start : start + size]), window)
        for window, layers in kinds.items()
        for start in range(0, len(layers), size)
    )


@dataclass(slots=True, frozen=True)
class GrammarSource:
    """What a grammar says, for a grammar engine other than ours (a vLLM replica's): `kind`
    "json_schema", one JSON value valid under the schema in `text` (compact JSON); or "lark",
    the Lark grammar in `text`, in llguidance's dialect (`%json`, special tokens by id)."""

    kind: Literal["json_schema", "lark"]
    text: str


class OutputGrammar(Protocol):
    """What a request's output must follow (structured output): a grammar compiled by
    text/grammar.py. The engine passes it through untouched; the runner makes one matcher of
    it per sequence. `lazy`: it holds only the tool calls the model starts, free text aside.
    `source`: the grammar as another engine's grammar engine takes it."""

    @property
    def description(self) -> str: ...

    @property
    def lazy(self) -> bool: ...

    @property
    def source(self) -> GrammarSource: ...

    def matcher(self) -> Any: ...


# Below this temperature a draw is greedy. Dividing logits by less overflows float32 (1e-300
# makes every probability NaN), and a draw at this temperature is all but the argmax anyway.
GREEDY_BELOW_TEMPERATURE = 1e-5


@dataclass(slots=True, frozen=True)
class SamplingParams:
    """How to pick each next token and when to stop. `top_k == 0` and `top_p == 1.0` mean off;
    a temperature of 0 (or below `GREEDY_BELOW_TEMPERATURE`) means greedy.
    `repetition_penalty` (1.0: off) lowers every token already in the context, prompt and
    output, before anything else: a positive logit is divided by it, a negative one multiplied
    (transformers' and vLLM's rule). `grammar`, when set,
    is what the output must follow (structured output): the runner masks every other token.
    `logprobs`, when set, asks for each sampled token's log probability and the `logprobs`
    most likely tokens' (0: the chosen token's alone; None: nothing, and nothing computed)."""

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    repetition_penalty: float = 1.0
    seed: int | None = None
    max_tokens: int = 256
    min_tokens: int = 0
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    grammar: OutputGrammar | None = None
    logprobs: int | None = None

    @property
    def greedy(self) -> bool:
        return self.temperature < GREEDY_BELOW_TEMPERATURE or self.top_k == 1


# What a tool call may hold: all of its tool's arguments, or only the required ones.
ToolArguments = Literal["all", "required"]


@dataclass(slots=True, frozen=True)
class DefaultSampling:
    """The temperature, top_p, top_k and repetition penalty a request gets for each one it
    leaves out. As built, the protocols' own defaults (1.0, 1.0, off, off); a model's publisher
    may recommend others (`ServedModel.sampling`): a small model sampled at 1.0 strays into
    other languages and made-up tools, and the clients agents run (Claude Code, Codex) send no
    temperature."""

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    repetition_penalty: float = 1.0

    @classmethod
    def recommended(cls, values: dict[str, Any]) -> DefaultSampling | None:
        """The sampling a model's files recommend (any of this class's fields, by name), None
        when they name none; a value out of its range is left out, not trusted."""
        valid = {
            "temperature": lambda v: 0 <= v <= 2,
            "top_p": lambda v: 0 < v <= 1,
            "top_k": lambda v: v >= 0 and v == int(v),
            "repetition_penalty": lambda v: 0 < v <= 2,
        }
        found = {
            name: values[name]
            for name, ok in valid.items()
            if isinstance(values.get(name), (int, float)) and ok(values[name])
        }
        if not found:
            return None
        base = cls()
        return cls(
            float(found.get("temperature", base.temperature)),
            float(found.get("top_p", base.top_p)),
            int(found.get("top_k", base.top_k)),
            float(found.get("repetition_penalty", base.repetition_penalty)),
        )

    def fill(
        self,
        temperature: float | None,
        top_p: float | None,
        top_k: int | None,
        repetition_penalty: float | None = None,
    ) -> dict[str, Any]:
        """A request's choices as `SamplingParams` fields: its own values where it set them,
        these elsewhere."""
        return {
            "temperature": self.temperature if temperature is None else temperature,
            "top_p": self.top_p if top_p is None else top_p,
            "top_k": self.top_k if top_k is None else top_k,
            "repetition_penalty": (
                self.repetition_penalty if repetition_penalty is None else repetition_penalty
            ),
        }


# What the Anthropic and OpenAI APIs themselves default to.
PROTOCOL_SAMPLING = DefaultSampling()


class FinishReason(enum.StrEnum):
    STOP = "stop"  # end-of-sequence token, stop token or stop string
    LENGTH = "length"  # max_tokens or the model's context
    ABORT = "abort"  # the client went away or cancelled
    ERROR = "error"  # the engine failed this request

    @property
    def answered(self) -> bool:
        """Whether the request got its answer: neither stopped by its client nor failed."""
        return self not in (FinishReason.ABORT, FinishReason.ERROR)


@dataclass(slots=True, frozen=True)
class Breakpoint:
    """A prefix of a request's prompt its client will send again (an Anthropic `cache_control`
    breakpoint, an OpenAI `prompt_cache_retention`): its first `num_tokens` tokens are kept at
    least `ttl_s` seconds (`cache/agents/retention.py`)."""

    num_tokens: int
    ttl_s: float


@dataclass(slots=True)
class Request:
    """One generation request, as the API layer hands it to the engine."""

    request_id: str
    prompt_token_ids: list[int]
    sampling: SamplingParams
    agent_id: str | None = None
    # The caller's (`AgentKey`): the scope of `agent_id`, and whose cache its prompt may reuse.
    owner: str | None = None
    arrival_time: float = field(default_factory=time.monotonic)
    breakpoints: tuple[Breakpoint, ...] = ()  # prefixes to keep, first to last

    @property
    def agent(self) -> AgentKey | None:
        """The agent this request continues, if it names one."""
        return None if self.agent_id is None else AgentKey(self.agent_id, self.owner)


class SequenceStatus(enum.Enum):
    WAITING = enum.auto()
    RESTORING = enum.auto()  # admitted, holding its blocks, waiting for some from disk
    RUNNING = enum.auto()
    FINISHED = enum.auto()


@dataclass(slots=True, frozen=True)
class Restore:
    """Pages an admitted sequence waits for from disk: `pages[i]` (a page of its `indexes[i]`-th
    block) gets the content saved under the page key `keys[i]`; a trailing partial block gives
    its first `tail_tokens`. Once all are in, the sequence has KV for `num_tokens` tokens, its
    full blocks hashed as `block_hashes`."""

    pages: list[int]
    keys: list[int]
    indexes: list[int]
    tail_tokens: int
    num_tokens: int
    disk_tokens: int  # of `num_tokens`, those in blocks some of these pages belong to
    block_hashes: list[int]


@dataclass(slots=True)
class BlockTable:
    """A sequence's pages in one layer group: `pages[i]` holds block `first + i`. The blocks
    before `first` have left the group's window: their pages were given back (`first` stays 0
    for full attention)."""

    first: int = 0
    pages: list[int] = field(default_factory=list)

    @property
    def end(self) -> int:
        """The block after the last one it has a page for."""
        return self.first + len(self.pages)

    def page(self, block: int) -> int:
        return self.pages[block - self.first]

    def padded(self) -> list[int]:
        """Indexed by block, as the runner reads it: the blocks before `first` are never read
        (they are out of the window), so page 0 stands in for them."""
        return [0] * self.first + self.pages if self.first else list(self.pages)


@dataclass(slots=True)
class Sequence:
    """The engine's state for one request: its tokens, how many have KV in the pool, its pages.

    Invariant: `num_computed_tokens <= len(token_ids)`, and each layer group's `block_tables`
    entry covers at least the blocks of its first `num_computed_tokens` tokens that the group
    still reads.
    """

    seq_id: int
    request: Request
    token_ids: list[int]
    num_prompt_tokens: int
    num_computed_tokens: int = 0
    num_cached_tokens: int = 0  # prompt tokens whose KV came from the cache, not from prefill
    block_tables: list[BlockTable] = field(default_factory=list)  # one per layer group
    block_hashes: list[int] = field(default_factory=list)  # chain hashes of the full blocks
    status: SequenceStatus = SequenceStatus.WAITING
    finish_reason: FinishReason | None = None
    first_scheduled_time: float | None = None
    first_token_time: float | None = None  # time.monotonic() when its first output token came
    restore: Restore | None = None  # what it waits for while RESTORING
    started: bool = False  # has run at least once (its cached-token counts are final)
    preempted_at: float | None = None  # time.monotonic() when it was last taken out to wait
    num_disk_tokens: int = 0  # of `num_cached_tokens`, those read back from disk
    cache_tier: int = 0  # the eviction tier its blocks are cached at when released
    missing_hash: int | None = None  # on arrival, the first full block of its prompt not cached
    cache_miss: CacheMiss | None = None  # on arrival, where and why its prompt missed the cache
    draft_limit: int | None = None  # the longest draft it may have next (None: none verified yet)

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens

    @property
    def output_token_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens :]

    @property
    def in_prefill(self) -> bool:
        return self.num_computed_tokens < self.num_prompt_tokens


@dataclass(slots=True, frozen=True)
class BatchItem:
    """One sequence's share of a step: a prefill chunk, a single decode token, or a decode token
    and a draft to verify (speculative decoding).

    `token_ids` sit at positions `start_pos ..`; their K/V go to the slots that `block_tables`
    (one per layer group, each indexed by block: `BlockTable.padded`) give those positions.
    `sample` says whether the step must return the next token (the last chunk of a prompt, or a
    decode). A decode with a draft has `token_ids` = its last token, then `draft_token_ids`:
    the runner returns the draft tokens it accepts and the token after them (`ModelRunner.run`).
    """

    seq_id: int
    token_ids: list[int]
    start_pos: int
    block_tables: list[list[int]]
    sample: bool
    sampling: SamplingParams
    num_output_tokens: int  # tokens generated so far: seeds the per-step random stream
    suppress_token_ids: tuple[int, ...] = ()  # never sample these (end tokens before min_tokens)
    # The whole context, prompt and output, for a row that samples with a repetition penalty
    # (the sequence's own list, read during the step; empty for every other row).
    context_token_ids: list[int] = field(default_factory=list)
    draft_token_ids: tuple[int, ...] = ()  # the draft `token_ids` ends with (none: no draft)


@dataclass(slots=True, frozen=True)
class TokenLogprob:
    """A sampled token with its log probability under the model (the log-softmax of its logits
    before the request's penalty, temperature, top-k/top-p or grammar change them, as vLLM
    reports by default), and the `top` most likely tokens as (id, log probability), most
    likely first: what a request asks for with `SamplingParams.logprobs`."""

    token_id: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()


# What a runner gives a batch item: nothing (a chunk mid-prompt), its token (with its log
# probabilities when its request asked for them), or a verified draft's tokens
# (`ModelRunner.run`).
StepToken = int | TokenLogprob | list[int] | None


@dataclass(slots=True, frozen=True)
class Batch:
    """What the scheduler hands the runner: plain data, no tensors. `copies` are (source,
    destination) page pairs to copy before computing (a reused partial block)."""

    items: list[BatchItem]
    copies: list[tuple[int, int]] = field(default_factory=list)

    @property
    def num_tokens(self) -> int:
        return sum(len(item.token_ids) for item in self.items)

    def __bool__(self) -> bool:
        return bool(self.items or self.copies)


@dataclass(slots=True, frozen=True)
class History:
    """What a finished sequence leaves cached: its full blocks' chain hashes and the hash of its
    partial last block (None when it ended on a block boundary)."""

    block_hashes: list[int]
    tail_hash: int | None
    num_tokens: int


@dataclass(slots=True, frozen=True)
class CacheMiss:
    """Why a prompt was not served from the cache further than it was: `position` is its first
    token the cache did not serve, where it parted from the nearest cached chain, and `reason`
    why (`cache/agents/misses.py` names the reasons)."""

    position: int
    reason: str


@dataclass(slots=True, frozen=True)
class Usage:
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int = 0
    # What each of the request's breakpoints holds now, in tokens (whole blocks, so up to a
    # block fewer than it marked; 0 when its prefix could not be kept), in their order.
    retained_tokens: tuple[int, ...] = ()


@dataclass(slots=True, frozen=True)
class TokenEvent:
    """What the engine publishes for a request after a step: new tokens and their text.

    The last event of a request has `finish_reason` and `usage` set; an event with `error` set is
    also the last one. A request streamed with `announce` gets a first event with no tokens once
    the engine has taken it in, carrying its `cache_miss` (None when its prompt missed
    nothing it could have had).
    """

    request_id: str
    token_ids: list[int]
    text: str
    finish_reason: FinishReason | None = None
    usage: Usage | None = None
    error: Exception | None = None
    stop_string: str | None = None  # the stop sequence that ended the output, if one did
    cache_miss: CacheMiss | None = None
    # One per token of `token_ids`, when the request asked for them (`SamplingParams.logprobs`).
    logprobs: tuple[TokenLogprob, ...] | None = None

    @property
    def final(self) -> bool:
        return self.finish_reason is not None or self.error is not None
