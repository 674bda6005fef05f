"""Write-behind: after each turn of a named agent, the pages of its history that the disk lacks
(the turn's new full blocks and its partial tail) are copied out of the pool a few at a time and
written in the background, so a crash (kill -9, a power cut) costs at most the turn in flight.

The copies run on the engine thread (they read the pool), after the step's tokens went out, a
bounded number of bytes a step; the writes run on the writer thread (`cache/disk/writer.py`).
"""

from __future__ import annotations

import contextlib
from collections import OrderedDict
from dataclasses import dataclass

from semantic.cache.agents.agent import Agent
from semantic.cache.agents.records import AgentRecords
from semantic.cache.agents.registry import AgentRegistry
from semantic.cache.disk.tiering import HotBlock, Tiering
from semantic.cache.pages.prefix import PrefixCache, split_key
from semantic.core import AgentKey, History
from semantic.errors import PersistFailed

# Write-behind copies wait while the writer has this much queued (a quarter of its own bound,
# `cache/disk/writer.py`, so eviction, which waits for room there, always finds it): a disk
# slower than the turns holds back the write-behind, never the engine loop.
MAX_QUEUED_BYTES = 32 * 2**20
# Bytes copied out of the pool in one engine step (at least one page): the copy delays the
# step after it by about a millisecond per few MiB on a CPU.
STEP_BYTES = 8 * 2**20
# Agents whose turns wait to be copied; past it the oldest waiting turn is dropped (its pages
# go with its agent's next turn, or on eviction and at shutdown).
MAX_WAITING = 1024


@dataclass(slots=True)
class _Turn:
    """One agent's history to write: its page keys in chain order, how far they were looked
    at, and what may happen once every page is durable."""

    agent: Agent
    history: History
    keys: list[int]
    replaced: list[int]  # tails of its earlier histories: their files go once this is durable
    next_key: int = 0
    failed: bool = False  # a write failed (set and read on the writer thread)


class WriteBehind:
    """Writes each named agent's turn to disk behind it.

    Bounded: at most `step_bytes` are copied a step, none while the writer has
    `max_queued_bytes` queued (the turn waits for the disk, never holding up the engine loop),
    and a newer turn of an agent takes the place of one still waiting: only the newest history
    is written, and pages the disk has (or has queued) are skipped, so nothing is written twice.
    A history larger than the disk budget is not written: it would push out its own first
    blocks. Past `max_waiting` agents waiting, the oldest turn is dropped.

    Ordered: an agent's manifest is written only once every page of the history it names is
    durable, and names that history, never a later one whose pages may not be. A partial
    tail's file is replaced once the turn after it is durable: the tail an agent's earlier
    history left, when no agent names it any more, is deleted then (its tokens begin the new
    history's), and its cached pages are freed at once. Agents with a conversation (the agent
    API) have their manifest written at each turn by the API; only their pages are written here.
    """

    def __init__(
        self,
        prefix: PrefixCache,
        registry: AgentRegistry,
        records: AgentRecords,
        tiering: Tiering,
        *,
        max_queued_bytes: int = MAX_QUEUED_BYTES,
        step_bytes: int = STEP_BYTES,
        max_waiting: int = MAX_WAITING,
    ) -> None:
        self.prefix = prefix
        self.registry = registry
        self.records = records
        self.tiering = tiering
        self.max_queued_bytes = max_queued_bytes
        self.step_bytes = step_bytes
        self.max_waiting = max_waiting
        self._waiting: OrderedDict[AgentKey, _Turn] = OrderedDict()
        # The partial tail each agent's last turn left, the most recent agents' only.
        self._tails: OrderedDict[AgentKey, int] = OrderedDict()

    @property
    def pending(self) -> bool:
        """Whether turns wait to be copied."""
        return bool(self._waiting)

    def turn_ended(self, agent: Agent) -> None:
        """A named agent's turn ended and its history is the agent's: queue it (on the engine
        thread)."""
        keys = self.prefix.history_keys(agent.hashes, agent.num_tokens)
        earlier = self._waiting.pop(agent.key, None)
        replaced = [] if earlier is None else earlier.replaced
        tail = self._tails.pop(agent.key, None)
        if tail is not None and tail not in agent.hashes and not self.registry.names(tail):
            replaced.append(tail)
            for key in self.prefix.keys(tail):  # a cached page, else evicted it is
                self.prefix.discard(key)  # written again: its tokens begin the new tail
        if agent.tail_hash is not None:
            self._tails[agent.key] = agent.tail_hash
            if len(self._tails) > 4 * self.max_waiting:
                self._tails.popitem(last=False)
        disk = self.tiering.disk
        if len(keys) * disk.spec.bytes_per_page > disk.budget_bytes:
            self.tiering.count_write_behind_dropped()
            return
        history = History(list(agent.block_hashes), agent.tail_hash, agent.num_tokens)
        self._waiting[agent.key] = _Turn(agent, history, keys, replaced)
        if len(self._waiting) > self.max_waiting:
            self._waiting.popitem(last=False)
            self.tiering.count_write_behind_dropped()

    def step(self) -> bool:
        """Copy pages of waiting turns, the oldest turn first, within this step's bounds (on the
        engine thread, after the step's tokens went out). Returns whether it copied any."""
        page_bytes = self.tiering.disk.spec.bytes_per_page
        copied = 0  # bytes this step
        while self._waiting:
            turn = next(iter(self._waiting.values()))
            while turn.next_key < len(turn.keys):
                hot = self._hot(turn.keys[turn.next_key])
                if hot is not None:
                    spent = copied and copied + page_bytes > self.step_bytes
                    if spent or not self._room(page_bytes):
                        return copied > 0
                    self._write(turn, hot)
                    copied += page_bytes
                turn.next_key += 1
            del self._waiting[turn.agent.key]
            self._submitted(turn)
        return copied > 0

    def _hot(self, key: int) -> HotBlock | None:
        """The page to write for `key`: None when the disk has it (with its mark) or has it
        queued, or when the pool has it no more (evicted, and so written, or discarded)."""
        prefix = self.prefix
        page = prefix.pool.lookup(key)
        content = prefix.content(split_key(key)[0])
        ends_history = prefix.marks_history_end(key)
        if page is None or content is None or self.tiering.holds(key, ends_history):
            return None
        return page, key, *content, ends_history

    def _room(self, page_bytes: int) -> bool:
        queued = self.tiering.writer.queued_bytes
        return queued + page_bytes <= self.max_queued_bytes or not queued

    def _write(self, turn: _Turn, hot: HotBlock) -> None:
        def done(size: int, error: BaseException | None) -> None:
            turn.failed |= error is not None

        self.tiering.write_behind(hot, done)

    def _submitted(self, turn: _Turn) -> None:
        """Every page of the turn is on disk or queued: once every write queued so far has
        ended (its own, and an earlier turn's or an eviction's of a page it names), the turn is
        durable. The tails it replaced count as gone from now on (`DiskWriter.delete_behind`:
        one computed again meanwhile is written again, after their deletion)."""
        replaced = [key for tail in turn.replaced for key in self.prefix.keys(tail)]
        if replaced:
            self.tiering.writer.delete_behind(replaced, lambda keys: self._drop_tails(turn, keys))
        self.tiering.writer.after(lambda: self._durable(turn))

    def _drop_tails(self, turn: _Turn, keys: list[int]) -> None:
        """Every page of the turn's history is on disk (on the writer thread): the tails it
        replaced may go. Not after a failed write: the history is not all there."""
        if not turn.failed:
            self.tiering.delete(keys)

    def _durable(self, turn: _Turn) -> None:
        """Every page of the turn's history is on disk (on the writer thread): the agent's
        manifest may name it now. Not after a failed write: the history is not all there."""
        if turn.failed:
            return
        if turn.agent.conversation is None:
            with contextlib.suppress(PersistFailed):  # logged; its last manifest stays
                self.records.save(turn.agent, history=turn.history)
