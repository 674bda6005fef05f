"""How much conversation text each API key's agents keep, and its bound
(`max_conversations_mb_per_key`): a key cannot make the server hold unbounded text, however many
agents or forks it makes.

A conversation counts once per key however many of the key's agents hold it: forks that have
not diverged share one value (`cache/agents/conversation.py`), in memory and on disk alike, so they
cost the key nothing more. A fork another key makes of an agent counts for that key too.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

from semantic.cache.agents.conversation import Conversation
from semantic.errors import ConversationQuotaExceeded


@dataclass(slots=True)
class _Held:
    conversation: Conversation  # kept, so that its `id` names it while it is counted
    agents: int


class ConversationQuota:
    """The conversations each owner's agents hold, by identity, and their text's bytes.

    Invariant: `_bytes[owner]` is the sum of `text_bytes()` over `_held[owner]`, and each entry
    counts the owner's agents holding that value. Thread-safe: a turn's conversation becomes its
    agent's off the engine thread, once its manifest is written."""

    def __init__(self, limit_bytes: int) -> None:
        self.limit_bytes = limit_bytes
        self._held: dict[str | None, dict[int, _Held]] = {}
        self._bytes: dict[str | None, int] = {}
        self._lock = threading.Lock()

    def check(
        self, owner: str | None, adding: Conversation, dropping: Conversation | None = None
    ) -> None:
        """ConversationQuotaExceeded when one of the owner's agents taking `adding` in place of
        `dropping` would put the owner past the limit."""
        with self._lock:
            held = self._held.get(owner, {})
            after = self._bytes.get(owner, 0)
            if id(adding) not in held:
                after += adding.text_bytes()
            if dropping is not None and (entry := held.get(id(dropping))) and entry.agents == 1:
                after -= dropping.text_bytes()
        if after > self.limit_bytes:
            raise ConversationQuotaExceeded(
                f"this API key's agents would keep {after} bytes of conversation; a key keeps "
                f"at most {self.limit_bytes} (max_conversations_mb_per_key): delete agents "
                "(DELETE /v1/agents/{agent_id}) to make room"
            )

    def swap(
        self, owner: str | None, dropping: Conversation | None, adding: Conversation | None
    ) -> None:
        """One of the owner's agents lets go of `dropping` and holds `adding` (None: nothing)."""
        if adding is dropping:
            return
        with self._lock:
            held = self._held.setdefault(owner, {})
            if adding is not None:
                entry = held.setdefault(id(adding), _Held(adding, 0))
                entry.agents += 1
                if entry.agents == 1:
                    self._bytes[owner] = self._bytes.get(owner, 0) + adding.text_bytes()
            if dropping is not None and (gone := held.get(id(dropping))) is not None:
                gone.agents -= 1
                if gone.agents == 0:
                    del held[id(dropping)]
                    self._bytes[owner] -= dropping.text_bytes()

    def held_bytes(self, owner: str | None) -> int:
        with self._lock:
            return self._bytes.get(owner, 0)
