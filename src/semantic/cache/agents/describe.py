"""An agent described as plain data, for the agent API and `/admin/cache`: its history, pin,
statistics, where its blocks are and what they take, and its conversation's size (taken on the
engine thread)."""

from __future__ import annotations

from typing import Any

from semantic.cache.agents.agent import Agent, history_pages
from semantic.cache.agents.conversation import Conversation
from semantic.cache.disk.tier import DiskTier
from semantic.cache.pages.prefix import PrefixCache


def describe(agent: Agent, prefix: PrefixCache, disk: DiskTier) -> dict[str, Any]:
    """The agent and its cache statistics."""
    hot = history_pages(prefix, agent)
    keys = [key for block_hash in agent.hashes for key in prefix.keys(block_hash)]
    stats = agent.stats
    return {
        "agent_id": agent.agent_id,
        "owner": agent.owner,
        "cached_tokens": agent.num_tokens,
        "pinned": agent.pinned,
        "working": agent.working,
        "requests": stats.requests,
        "hit_tokens": stats.hit_tokens,
        "disk_hit_tokens": stats.disk_hit_tokens,
        "miss_tokens": stats.miss_tokens,
        "miss_reasons": dict(stats.miss_reasons),
        "bytes_in_memory": len(hot) * disk.spec.bytes_per_page,
        # what every layer's K/V of its blocks would take: more with sliding windows
        "bytes_full_attention": len(agent.hashes) * disk.spec.bytes_per_block,
        "bytes_on_disk": sum(disk.size_of(key) for key in keys),
        "last_used": stats.last_used,
        "generating": agent.turn is not None,
        "conversation": _summary(agent.conversation),
    }


def _summary(conversation: Conversation | None) -> dict[str, Any] | None:
    """What a description tells of a conversation: its size, never its text (a list of ninety
    forks of an 8 MB system prompt would carry 720 MB); `/messages` reads the text."""
    if conversation is None:
        return None
    return {
        "defaults": conversation.defaults.to_json(),
        "messages": len(conversation.messages),
        "text_bytes": conversation.text_bytes(),
    }
