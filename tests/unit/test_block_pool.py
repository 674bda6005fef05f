"""The block pool's bookkeeping: states, refcounts, LRU of cached blocks, integrity."""

from __future__ import annotations

import random

import pytest

from semantic.cache.pages.block_pool import (
    TIER_ONE_OFF,
    TIER_OUT_OF_WINDOW,
    TIER_WORKING_AGENT,
    BlockPool,
)


def test_allocate_and_release_return_every_block() -> None:
    pool = BlockPool(8)
    blocks = pool.allocate(5)
    assert len(set(blocks)) == 5 and pool.num_available() == 3
    pool.release(blocks)
    assert pool.num_available() == 8
    pool.check_integrity()


def test_allocation_is_all_or_nothing() -> None:
    pool = BlockPool(4)
    pool.allocate(3)
    with pytest.raises(MemoryError):
        pool.allocate(2)
    assert pool.num_available() == 1
    pool.check_integrity()


def test_double_release_cannot_steal_another_owners_reference() -> None:
    pool = BlockPool(4)
    [block] = pool.allocate(1)
    pool.acquire(block)  # a second owner
    pool.release([block])
    assert pool.refcount(block) == 1
    pool.release([block])
    pool.release([block])  # one release too many: a no-op
    assert pool.refcount(block) == 0 and pool.num_available() == 4
    pool.check_integrity()


def test_hashed_blocks_stay_cached_and_are_reclaimed_oldest_first() -> None:
    pool = BlockPool(3)
    a, b, c = pool.allocate(3)
    pool.set_hash(a, 111)
    pool.set_hash(b, 222)
    pool.release([a])
    pool.release([b])
    pool.release([c])
    assert pool.num_cached == 2 and pool.num_available() == 3
    assert pool.lookup(111) == a
    [first] = pool.allocate(1)
    assert first == c  # a free block goes before any cached one
    [second] = pool.allocate(1)
    assert second == a and pool.lookup(111) is None  # then the least recently released
    assert pool.lookup(222) == b
    pool.check_integrity()


def test_acquiring_a_cached_block_takes_it_out_of_the_lru() -> None:
    pool = BlockPool(2)
    [block] = pool.allocate(1)
    pool.set_hash(block, 7)
    pool.release([block])
    pool.acquire(block)
    assert pool.num_cached == 0 and pool.refcount(block) == 1
    pool.allocate(1)
    with pytest.raises(MemoryError):
        pool.allocate(1)
    pool.check_integrity()


def test_a_release_never_lowers_a_blocks_tier() -> None:
    pool = BlockPool(4)
    agent_block, fresh = pool.allocate(2)
    pool.set_hash(agent_block, 1)
    pool.set_hash(fresh, 2)
    pool.release([agent_block], TIER_WORKING_AGENT)
    pool.acquire(agent_block)  # a request with no agent reuses the agent's block
    pool.release([agent_block, fresh], TIER_ONE_OFF)
    assert pool.tier_of(agent_block) == TIER_WORKING_AGENT
    assert pool.tier_of(fresh) == TIER_ONE_OFF
    pool.check_integrity()


def test_a_reclaimed_block_forgets_its_old_tier() -> None:
    pool = BlockPool(1)
    [block] = pool.allocate(1)
    pool.set_hash(block, 1)
    pool.release([block], TIER_WORKING_AGENT)
    [again] = pool.allocate(1)  # reclaimed for new content
    pool.set_hash(again, 2)
    pool.release([again], TIER_ONE_OFF)
    assert pool.tier_of(again) == TIER_ONE_OFF
    pool.check_integrity()


def test_a_page_dropped_out_of_its_window_is_reclaimed_first_and_never_reported_above_it() -> None:
    pool = BlockPool(4)
    passed, shared, kept, plain = pool.allocate(4)
    for page, key in ((passed, 1), (shared, 2), (kept, 3)):
        pool.set_hash(page, key)
    pool.release([passed, kept], TIER_WORKING_AGENT)  # an agent's history ended here
    pool.acquire(passed)  # its next turn reads them, then its window moves past one
    pool.acquire(kept)
    pool.acquire(shared)  # another sequence still reads this one
    pool.drop([passed, shared, plain])
    assert pool.tier_of(passed) == TIER_OUT_OF_WINDOW  # lowered, unlike a release
    assert pool.refcount(shared) == 1 and pool.tier_of(shared) is None
    assert pool.refcount(plain) == 0 and pool.num_free == 1  # nothing to keep: free
    pool.release([kept, shared], TIER_WORKING_AGENT)
    reclaimed: list[tuple[int, int]] = []
    pool.on_reclaim = lambda page, key, tier: reclaimed.append((key, tier))
    pool.allocate(2)  # the free page, then the out-of-window one before any agent's
    assert reclaimed == [(1, TIER_OUT_OF_WINDOW)]
    pool.check_integrity()


def test_random_operations_keep_the_invariants() -> None:
    rng = random.Random(0)
    pool = BlockPool(32)
    owners: list[list[int]] = []
    for step in range(2000):
        action = rng.random()
        if action < 0.4 and pool.num_available():
            blocks = pool.allocate(rng.randint(1, min(4, pool.num_available())))
            if rng.random() < 0.5:
                pool.set_hash(blocks[0], step)
            owners.append(blocks)
        elif action < 0.5 and owners:
            shared = rng.choice(owners)
            for block in shared:
                pool.acquire(block)
            owners.append(list(shared))
        elif owners:
            give_back = pool.drop if rng.random() < 0.3 else pool.release
            give_back(owners.pop(rng.randrange(len(owners))))
        pool.check_integrity()
    for blocks in owners:
        pool.release(blocks)
    assert pool.num_available() == 32
    pool.check_integrity()
