"""Why a prompt missed: where it parted from the nearest cached chain and why the cache served
no further, told once per request as it arrives; and the last misses, a bounded list, for
/admin/cache.

The nearest chain of a named agent's request is the agent's last history, compared by block
hashes (the prompt's blocks are hashed again only when the cache served less than that
history); of any other request, the longest chain the cache holds. Only positions and reasons
leave here, never a token.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from semantic.cache.agents.stats import MISS_EVICTED, MISS_OTHER_MODEL
from semantic.cache.pages.prefix import PrefixMatch, chain_hash
from semantic.core import CacheMiss, History, Request

# Why the cache served a prompt no further than `CacheMiss.position`: these, and cache_stats.py's
# MISS_EVICTED (the chain went on with these tokens, but the memory and disk budgets let it
# go), MISS_CORRUPT (it failed its checks on disk) and MISS_OTHER_MODEL (the agent's cache is
# another model's, other weights' or another KV dtype's).
MISS_PROMPT_CHANGED = "prompt_changed"  # the agent's last history went on otherwise here
MISS_NEVER_SEEN = "never_seen"  # nothing cached ever went on from here with these tokens
MISS_WINDOW_PASSED = "window_passed"  # a sliding window's pages here were reclaimed

RECENT_MISSES = 256  # the misses /admin/cache lists, newest last


@dataclass(slots=True, frozen=True)
class Lookup:
    """What a request's prompt found as it arrived: `match` in the chain from `root`, and the
    history of the agent it names (None: no agent, or one with nothing cached here yet)."""

    prompt: Sequence[int]
    match: PrefixMatch
    root: int
    history: History | None


def diagnose(
    lookup: Lookup,
    why_gone: Callable[[int], str | None],
    known_elsewhere: Callable[[], bool],
) -> CacheMiss | None:
    """Where and why `lookup.prompt` missed the cache, or None when the cache served all it
    could have had: all but its last token (always computed), or the whole of the history it
    continues. `why_gone` tells what became of a block no longer cached (evicted or corrupt),
    `known_elsewhere` whether another model's cache has the agent."""
    prompt, match, history = lookup.prompt, lookup.match, lookup.history
    position = match.num_tokens
    if position >= len(prompt) - 1:
        return None
    if match.reach > position:
        return CacheMiss(position, MISS_WINDOW_PASSED)
    gone = why_gone(match.missing) if match.missing is not None else None
    if gone is not None:
        return CacheMiss(position, gone)
    if history is not None:
        if position >= history.num_tokens:
            return None  # as much as its whole last history: the rest is new
        size = match.block_tokens
        repeated = _repeated(prompt, history, lookup.root, size)
        if position < repeated:  # the prompt goes on as the history did: the cache lost it
            return CacheMiss(position, _why_lost(history, position, size, why_gone))
        if position < repeated + size:  # in the block where the prompt parts from it
            return CacheMiss(position, MISS_PROMPT_CHANGED)
    if match.extends_history:
        return None  # it continues a conversation whole
    if position == 0 and history is None and known_elsewhere():
        return CacheMiss(0, MISS_OTHER_MODEL)
    return CacheMiss(position, MISS_NEVER_SEEN)


def _why_lost(
    history: History, position: int, size: int, why_gone: Callable[[int], str | None]
) -> str:
    """Why the history's block at `position` is gone: what became of its partial tail when the
    position is in it (a full block's fate was asked as the match's `missing`), else evicted."""
    tail = history.tail_hash
    if tail is not None and position >= len(history.block_hashes) * size:
        return why_gone(tail) or MISS_EVICTED
    return MISS_EVICTED


def _repeated(prompt: Sequence[int], history: History, root: int, size: int) -> int:
    """How many of the history's tokens the prompt repeats, in whole blocks of `size` (its
    tail counts whole or not at all): the history's chain hashes against the prompt's."""
    parent, repeated = root, 0
    for block_hash in history.block_hashes:
        block = prompt[repeated : repeated + size]
        if len(block) < size or chain_hash(parent, block) != block_hash:
            return repeated
        parent, repeated = block_hash, repeated + size
    end, tail = history.num_tokens, history.tail_hash
    whole = tail is not None and len(prompt) >= end
    return end if whole and chain_hash(parent, prompt[repeated:end]) == tail else repeated


@dataclass(slots=True, frozen=True)
class MissRecord:
    """One request's miss as /admin/cache lists it: ids, sizes, position and reason, no text."""

    at: float  # time.time() when it finished
    request_id: str
    agent_id: str | None
    owner: str | None
    prompt_tokens: int
    cached_tokens: int
    position: int
    reason: str

    @classmethod
    def of(cls, request: Request, miss: CacheMiss, cached: int, at: float) -> MissRecord:
        return cls(
            at,
            request.request_id,
            request.agent_id,
            request.owner,
            len(request.prompt_token_ids),
            cached,
            miss.position,
            miss.reason,
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "at": self.at,
            "request_id": self.request_id,
            "agent_id": self.agent_id,
            "owner": self.owner,
            "prompt_tokens": self.prompt_tokens,
            "cached_tokens": self.cached_tokens,
            "position": self.position,
            "reason": self.reason,
        }


class RecentMisses:
    """The last `RECENT_MISSES` misses, oldest first: a fixed-size list, so a server that misses
    for days holds no more than a busy minute's. Written and read on the engine thread."""

    def __init__(self, size: int = RECENT_MISSES) -> None:
        self._records: deque[MissRecord] = deque(maxlen=size)

    def add(self, record: MissRecord) -> None:
        self._records.append(record)

    def seen_by(self, sees: Callable[[str | None], bool]) -> list[dict[str, Any]]:
        """The records of the owners `sees` allows, as plain data."""
        return [record.to_json() for record in self._records if sees(record.owner)]
