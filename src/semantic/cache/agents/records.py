"""The agents' records on disk: each agent's manifest (its history, pin, owner and
conversation) written, removed and read back at start, kept in step with the registry.

A manifest is written on `persist`, at shutdown, and behind each turn once the blocks it names
are on disk (`write_behind.py`); an agent with a conversation (the agent API) has its own
written at each turn too, a few bytes that cannot be computed again. Blocks need no manifest to
be found: a prompt walks its chain in memory and on disk alike (`cache/pages/prefix.py`).

`save` runs on any thread (it does disk I/O), the rest on the engine thread; `lock` serializes
the manifest writes and deletes with the registry's changes of who is there, so a write that
lost the race with a delete never brings the agent back.
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path

from semantic.cache.agents.agent import Agent
from semantic.cache.agents.conversation import Conversation
from semantic.cache.agents.manifest import AgentManifest, ManifestFiles
from semantic.cache.agents.registry import AgentRegistry
from semantic.cache.disk.tiering import Tiering
from semantic.core import History
from semantic.errors import PersistFailed

log = logging.getLogger(__name__)


class AgentRecords:
    def __init__(self, manifests: ManifestFiles, registry: AgentRegistry, tiering: Tiering) -> None:
        self.manifests = manifests
        self.registry = registry
        self.tiering = tiering
        self.lock = threading.Lock()

    @property
    def model_root(self) -> Path:
        return self.manifests.model_root

    def load(self) -> list[Agent]:
        """Register the agent of each manifest on disk (at start); returns them."""
        return [self.registry.add(_agent_of(manifest)) for manifest in self.manifests.load_all()]

    def save(
        self,
        agent: Agent,
        conversation: Conversation | None = None,
        history: History | None = None,
    ) -> bool:
        """Write the agent's manifest as it is now, on any thread (it does disk I/O: not the
        engine thread's). With `conversation`, that is written as the agent's, and becomes
        its own once it is on disk: how a turn commits, the agent held, so no other write of
        the manifest can come between. With `history`, that is the history it names (a turn's
        whose blocks are durable, while the agent may have gone on). False when the agent was
        deleted meanwhile; PersistFailed when the write failed, and then the file and the agent
        stay as they were."""
        with self.lock:
            if not self.registry.holds(agent):
                return False  # deleted (perhaps created again): this file is not ours any more
            kept = agent.conversation if conversation is None else conversation
            named = history or History(agent.block_hashes, agent.tail_hash, agent.num_tokens)
            try:
                self.manifests.save(self._manifest(agent, named, kept))
            except OSError as exc:
                raise _not_durable(agent, "written to", exc) from exc
            self.registry.keep_conversation(agent, kept)
        self.tiering.enforce_budget()  # the manifest counts in the disk budget
        return True

    def remove(self, agent: Agent) -> None:
        """The agent's manifest goes, and then the agent from the registry. When the manifest
        cannot be removed, PersistFailed, and the agent stays as it was (else it would come
        back at the next start)."""
        with self.lock:
            try:
                self.manifests.delete(agent.key)
            except OSError as exc:
                raise _not_durable(agent, "removed from", exc) from exc
            self.registry.remove(agent)

    def _manifest(
        self, agent: Agent, history: History, conversation: Conversation | None
    ) -> AgentManifest:
        return AgentManifest(
            agent.agent_id,
            self.model_root.name,
            list(history.block_hashes),
            history.tail_hash,
            history.num_tokens,
            found_blocks=agent.found_blocks,
            pinned=agent.pinned,
            conversation=conversation,
            owner=agent.owner,
        )


def _agent_of(manifest: AgentManifest) -> Agent:
    agent = Agent(
        manifest.key,
        list(manifest.block_hashes),
        manifest.tail_hash,
        manifest.num_tokens,
        manifest.pinned,
        conversation=manifest.conversation,
        found_blocks=manifest.found_blocks,
    )
    agent.stats.last_used = manifest.updated_at
    return agent


def _not_durable(agent: Agent, done: str, exc: OSError) -> PersistFailed:
    """The error of a manifest that could not be `done` disk: logged in full, told to the
    client without the server's paths."""
    log.warning("manifest of agent %s not %s disk: %s", agent.agent_id, done, exc)
    return PersistFailed(
        f"agent {agent.agent_id!r} could not be {done} disk ({exc.strerror}); nothing was changed"
    )
