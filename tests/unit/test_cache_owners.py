"""Keys do not share a cache's secrets, over the fake runner and the real app: each key's prompts
hash under a root of their own, so another key's guesses at a prompt find nothing of it cached
(`cached_tokens` would tell them, a token at a time), deleting an agent never touches another
key's cache (and of its own key's, only the blocks the agent computed), and an agent keeps
matching its own blocks after a restart. `share_cache_across_keys` shares as before; a server
without keys hashes as it always did."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from semantic.cache.pages.block_pool import BlockPool
from semantic.cache.pages.prefix import PrefixCache, chain_hash, owner_root, root_hash
from semantic.core import AgentKey
from semantic.models.served import ServedModel
from tests.unit.test_agent_owners import ADMIN_KEY, ALICE_KEY, BOB_KEY, as_, keyed, owner_of

pytestmark = pytest.mark.usefixtures("no_outside_settings")

SECRET = "My bank PIN is 4829, and my mother's maiden name is Quackenbush."
GUESSES = ["My bank PIN is 1", "My bank PIN is 4", "My bank PIN is 48", "My bank PIN is 482"]


def cached(client: TestClient, key: str, text: str, **body: Any) -> int:
    """The prompt tokens a one-message chat of `key` reused from the cache."""
    chat = {"model": "tiny", "max_tokens": 2, "messages": [{"role": "user", "content": text}]}
    response = client.post("/v1/chat/completions", json=chat | body, headers=as_(key))
    assert response.status_code == 200, response.text
    return int(response.json()["usage"]["prompt_tokens_details"]["cached_tokens"])


def bobs_guesses(client: TestClient) -> list[int]:
    """What Bob's guesses at the secret, and then the secret itself, reuse from the cache."""
    return [cached(client, BOB_KEY, text) for text in [*GUESSES, SECRET]]


def test_another_keys_guesses_at_a_prompt_find_only_what_it_cached_itself(
    chat_served: ServedModel, tmp_path: Path
) -> None:
    with keyed(chat_served, tmp_path / "alone") as (client, _):
        alone = bobs_guesses(client)  # what they reuse of one another
    assert alone[0] == 0
    with keyed(chat_served, tmp_path / "after") as (client, _):
        cached(client, ALICE_KEY, SECRET)
        assert bobs_guesses(client) == alone
        assert cached(client, ALICE_KEY, SECRET) > alone[-1]  # a key reuses its own prompts


def test_keys_that_share_the_cache_reuse_one_anothers_prompts(
    chat_served: ServedModel, tmp_path: Path
) -> None:
    with keyed(chat_served, tmp_path, share_cache_across_keys=True) as (client, _):
        cached(client, ALICE_KEY, SECRET)
        again = cached(client, ALICE_KEY, SECRET)
        assert again > 0
        assert cached(client, BOB_KEY, SECRET) == again


def test_deleting_an_agent_keeps_another_keys_cache_of_the_same_prompt(
    chat_served: ServedModel, tmp_path: Path
) -> None:
    with keyed(chat_served, tmp_path) as (client, _):
        cached(client, ALICE_KEY, SECRET, session_id="diary")
        cached(client, BOB_KEY, SECRET)
        bobs = cached(client, BOB_KEY, SECRET)
        assert bobs > 0
        deleted = client.delete("/v1/agents/diary", headers=as_(ALICE_KEY))
        assert deleted.status_code == 200, deleted.text
        assert cached(client, BOB_KEY, SECRET) == bobs


def test_deleting_an_agent_forgets_what_it_computed_and_keeps_what_it_found_cached(
    chat_served: ServedModel, tmp_path: Path
) -> None:
    diary = AgentKey("diary", owner_of(ALICE_KEY))
    with keyed(chat_served, tmp_path) as (client, engine):
        cached(client, ALICE_KEY, SECRET)
        anonymous = cached(client, ALICE_KEY, SECRET)
        more = f"{SECRET} And the safe opens with 31-41-59, left twice, then right."
        assert cached(client, ALICE_KEY, more, session_id="diary") > 0
        agent = engine.agents.by_key[diary]
        found, computed = agent.hashes[: agent.found_blocks], agent.computed
        assert found and computed
        assert client.post("/admin/cache/persist", headers=as_(ADMIN_KEY)).status_code == 200
    with keyed(chat_served, tmp_path) as (client, engine):  # it is known after a restart too
        assert engine.agents.by_key[diary].found_blocks == len(found)
        deleted = client.delete("/v1/agents/diary", headers=as_(ALICE_KEY))
        assert deleted.status_code == 200, deleted.text
        assert not any(engine.tiering.disk.contains(h) for h in computed)
        assert all(engine.tiering.disk.contains(h) for h in found)
        assert cached(client, ALICE_KEY, SECRET) == anonymous


def test_a_keys_agent_matches_its_blocks_on_disk_after_a_restart(
    chat_served: ServedModel, tmp_path: Path
) -> None:
    with keyed(chat_served, tmp_path) as (client, _):
        cached(client, ALICE_KEY, SECRET, session_id="diary")
        persisted = client.post("/admin/cache/persist", headers=as_(ADMIN_KEY))
        assert persisted.status_code == 200, persisted.text
        warm = cached(client, ALICE_KEY, SECRET, session_id="diary")
    with keyed(chat_served, tmp_path) as (client, engine):
        assert cached(client, BOB_KEY, SECRET) == 0
        assert cached(client, ALICE_KEY, SECRET, session_id="diary") == warm
        diary = engine.agents.by_key[AgentKey("diary", owner_of(ALICE_KEY))]
        assert diary.stats.disk_hit_tokens == warm  # its blocks, found on disk under its root


def test_each_owner_hashes_under_a_root_of_its_own() -> None:
    root = root_hash("test-model")
    prefix = PrefixCache(BlockPool(4), 8, root)
    alice, bob = prefix.root_of(owner_of(ALICE_KEY)), prefix.root_of(owner_of(BOB_KEY))
    assert len({root, alice, bob}) == 3 and alice == owner_root(root, owner_of(ALICE_KEY))
    assert prefix.chain(list(range(8)), alice) != prefix.chain(list(range(8)), bob)
    shared = PrefixCache(BlockPool(4), 8, root, share_across_owners=True)
    assert shared.root_of(owner_of(ALICE_KEY)) == shared.root_of(None) == root


def test_without_an_owner_blocks_hash_as_they_always_did() -> None:
    # Caches on disk are named by these hashes: a server without keys keeps finding them.
    prefix = PrefixCache(BlockPool(4), 8, root_hash("test-model"))
    assert prefix.root_of(None) == root_hash("test-model") == 0x48F68A5AEF34C0F8
    first = chain_hash(prefix.root_of(None), range(8))
    assert first == 0xB98BA0750A2D079E
    assert chain_hash(first, [9, 9, 9]) == 0x447EEDC0007A1E40
