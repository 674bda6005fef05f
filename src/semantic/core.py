"""The domain nouns every layer shares: requests, sequences, batches, events, cache geometry.

Standard library only: the engine's pure core and the HTTP layer both import this file.
"""

from __future__ import annotations

import enum
import re
import time
from dataclasses import dataclass, field

# Agent ids name files on disk later: letters, digits, '-', '_', '.', never a leading dot.
AGENT_ID_PATTERN = r"^[A-Za-z0-9_-][A-Za-z0-9._-]{0,127}$"


def is_valid_agent_id(agent_id: str) -> bool:
    return re.fullmatch(AGENT_ID_PATTERN, agent_id) is not None


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


@dataclass(slots=True, frozen=True)
class CacheSpec:
    """The geometry of one model's KV cache: what a block holds and how big it is.

    Cache files and prefix hashes are tagged with `tag()`, so a cache written for one geometry is
    never read into another. `layer_windows` gives each layer's attention: None for full
    attention, else the sliding window it reads (empty: full attention in every layer). A
    block holds every layer's K/V either way; the windows say what attention reads of them.
    """

    num_layers: int
    num_kv_heads: int
    head_dim: int
    dtype: str  # "bfloat16" | "float16" | "float32"
    block_tokens: int
    layer_windows: tuple[int | None, ...] = ()

    def __post_init__(self) -> None:
        if self.layer_windows and len(self.layer_windows) != self.num_layers:
            raise ValueError("layer_windows must name every layer's attention, or none")

    @property
    def sliding_windows(self) -> tuple[int, ...]:
        """The distinct windows of the sliding layers, smallest first."""
        return tuple(sorted({w for w in self.layer_windows if w is not None}))

    @property
    def dtype_bytes(self) -> int:
        return 4 if self.dtype == "float32" else 2

    @property
    def bytes_per_block(self) -> int:
        """K and V for every layer of one block."""
        per_layer = self.block_tokens * self.num_kv_heads * self.head_dim * self.dtype_bytes
        return 2 * self.num_layers * per_layer

    def tag(self) -> str:
        base = (
            f"L{self.num_layers}-kv{self.num_kv_heads}-d{self.head_dim}"
            f"-{self.dtype}-b{self.block_tokens}"
        )
        if not self.sliding_windows:
            return base  # the tag of every full-attention cache written before windows existed
        if len(self.sliding_windows) > 1:  # rare: every layer's window (0: full)
            return f"{base}-sw" + ".".join(str(w or 0) for w in self.layer_windows)
        # Which layers slide: a bit per layer, so two patterns never share a tag.
        pattern = sum(1 << i for i, w in enumerate(self.layer_windows) if w is not None)
        return f"{base}-sw{self.sliding_windows[0]}x{pattern:x}"


# Below this temperature a draw is greedy. Dividing logits by less overflows float32 (1e-300
# makes every probability NaN), and a draw at this temperature is all but the argmax anyway.
GREEDY_BELOW_TEMPERATURE = 1e-5


@dataclass(slots=True, frozen=True)
class SamplingParams:
    """How to pick each next token and when to stop. `top_k == 0` and `top_p == 1.0` mean off;
    a temperature of 0 (or below `GREEDY_BELOW_TEMPERATURE`) means greedy."""

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    max_tokens: int = 256
    min_tokens: int = 0
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False

    @property
    def greedy(self) -> bool:
        return self.temperature < GREEDY_BELOW_TEMPERATURE or self.top_k == 1


class FinishReason(enum.StrEnum):
    STOP = "stop"  # end-of-sequence token, stop token or stop string
    LENGTH = "length"  # max_tokens or the model's context
    ABORT = "abort"  # the client went away or cancelled
    ERROR = "error"  # the engine failed this request


@dataclass(slots=True)
class Request:
    """One generation request, as the API layer hands it to the engine."""

    request_id: str
    prompt_token_ids: list[int]
    sampling: SamplingParams
    agent_id: str | None = None
    owner: str | None = None  # the scope of `agent_id`: the caller's (`AgentKey`)
    arrival_time: float = field(default_factory=time.monotonic)

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
    """Blocks an admitted sequence waits for from disk: `blocks[i]` (its `indexes[i]`-th block)
    gets the content of `hashes[i]`; a trailing partial block gives its first `tail_tokens`.
    Once all are in, the sequence has KV for `num_tokens` tokens, its full blocks hashed as
    `block_hashes`."""

    blocks: list[int]
    hashes: list[int]
    indexes: list[int]
    tail_tokens: int
    num_tokens: int
    disk_tokens: int  # of `num_tokens`, those these blocks hold
    block_hashes: list[int]


@dataclass(slots=True)
class Sequence:
    """The engine's state for one request: its tokens, how many have KV in the pool, its blocks.

    Invariant: `num_computed_tokens <= len(token_ids)`, and `block_ids` cover at least
    `num_computed_tokens` tokens.
    """

    seq_id: int
    request: Request
    token_ids: list[int]
    num_prompt_tokens: int
    num_computed_tokens: int = 0
    num_cached_tokens: int = 0  # prompt tokens whose KV came from the cache, not from prefill
    block_ids: list[int] = field(default_factory=list)
    block_hashes: list[int] = field(default_factory=list)  # chain hashes of the full blocks
    status: SequenceStatus = SequenceStatus.WAITING
    finish_reason: FinishReason | None = None
    first_scheduled_time: float | None = None
    restore: Restore | None = None  # what it waits for while RESTORING
    started: bool = False  # has run at least once (its cached-token counts are final)
    outputs_at_start: int = 0  # output tokens it had when it last started running
    num_disk_tokens: int = 0  # of `num_cached_tokens`, those read back from disk
    cache_tier: int = 0  # the eviction tier its blocks are cached at when released
    missing_hash: int | None = None  # on arrival, the first full block of its prompt not cached

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
    """One sequence's share of a step: a prefill chunk or a single decode token.

    `token_ids` sit at positions `start_pos ..`; their K/V go to the slots that `block_table`
    gives those positions. `sample` says whether the step must return the next token (the last
    chunk of a prompt, or a decode).
    """

    seq_id: int
    token_ids: list[int]
    start_pos: int
    block_table: list[int]
    sample: bool
    sampling: SamplingParams
    num_output_tokens: int  # tokens generated so far: seeds the per-step random stream
    suppress_token_ids: tuple[int, ...] = ()  # never sample these (end tokens before min_tokens)


@dataclass(slots=True, frozen=True)
class Batch:
    """What the scheduler hands the runner: plain data, no tensors. `copies` are (source,
    destination) block pairs to copy before computing (a reused partial block)."""

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
class Usage:
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int = 0


@dataclass(slots=True, frozen=True)
class TokenEvent:
    """What the engine publishes for a request after a step: new tokens and their text.

    The last event of a request has `finish_reason` and `usage` set; an event with `error` set is
    also the last one.
    """

    request_id: str
    token_ids: list[int]
    text: str
    finish_reason: FinishReason | None = None
    usage: Usage | None = None
    error: Exception | None = None
    stop_string: str | None = None  # the stop sequence that ended the output, if one did

    @property
    def final(self) -> bool:
        return self.finish_reason is not None or self.error is not None
