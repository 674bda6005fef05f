"""Retention bookkeeping (`cache/agents/retention.py`) over a real pool and prefix index, on a
clock the test moves: what a kept prefix holds, for how long, how a hit renews it, and the key's
quota."""

from __future__ import annotations

import pytest

from semantic.cache.agents.retention import Retentions
from semantic.cache.pages.block_pool import BlockPool
from semantic.cache.pages.prefix import PrefixCache, root_hash
from semantic.errors import RetentionLimit
from tests.unit.fakes import ManualClock

BLOCK = 4


def cached_prefix(prefix: PrefixCache, tokens: list[int]) -> list[int]:
    """Blocks of `tokens` computed and cached as a finished request leaves them; their hashes."""
    pool, parent, hashes = prefix.pool, prefix.root, []
    pages = pool.allocate(len(tokens) // BLOCK)
    for index, page in enumerate(pages):
        parent = prefix.register([page], parent, tokens[index * BLOCK : (index + 1) * BLOCK])
        hashes.append(parent)
    pool.release(pages)
    return hashes


def setup(
    num_blocks: int = 16, max_tokens: int = 64, share: float = 0.5
) -> tuple[Retentions, PrefixCache, ManualClock]:
    prefix = PrefixCache(BlockPool(num_blocks), BLOCK, root_hash("retention-test"))
    clock = ManualClock()
    return Retentions(prefix, max_tokens, share, clock), prefix, clock


def check(prefix: PrefixCache) -> None:
    prefix.pool.check_integrity()
    prefix.check_integrity()


def test_a_kept_prefix_outlives_a_pool_full_of_one_offs() -> None:
    retentions, prefix, _ = setup()
    kept = cached_prefix(prefix, list(range(12)))
    retentions.keep(None, kept, ttl_s=300)
    others = prefix.pool.allocate(prefix.pool.num_available())  # everything else it can take
    assert len(others) == 16 - 3
    assert all(prefix.contains(h) for h in kept)
    assert retentions.protected() == frozenset(kept)
    prefix.pool.release(others)
    check(prefix)


def test_an_expired_retention_lets_go_of_its_pages_and_is_forgotten() -> None:
    retentions, prefix, clock = setup()
    kept = cached_prefix(prefix, list(range(8)))
    retentions.keep("key", kept, ttl_s=300)
    clock.now += 299
    assert retentions.expire() == 0 and prefix.pool.num_held == 2
    clock.now += 1
    assert retentions.expire() == 1
    assert len(retentions) == 0 and prefix.pool.num_held == 0
    assert retentions.protected() == frozenset() and retentions.tokens("key") == 0
    check(prefix)


def test_a_hit_renews_the_retentions_it_read_for_their_whole_ttl() -> None:
    retentions, prefix, clock = setup()
    kept = cached_prefix(prefix, list(range(8)))
    retentions.keep(None, kept, ttl_s=300)
    clock.now += 200
    assert retentions.renew(None, [*kept, 12345]) == 1  # read past it: it was read whole
    clock.now += 250  # 450 s after it was kept, 250 after the hit
    assert retentions.expire() == 0
    assert retentions.renew(None, kept[:1]) == 0  # read only in part: not a hit on it
    clock.now += 50
    assert retentions.expire() == 1
    check(prefix)


def test_keeping_again_never_shortens_a_retention_and_holds_each_page_once() -> None:
    retentions, prefix, clock = setup()
    kept = cached_prefix(prefix, list(range(8)))
    retentions.keep(None, kept, ttl_s=3600)
    retentions.keep(None, kept, ttl_s=300)
    assert len(retentions) == 1 and all(prefix.pool.refcount(p) == 1 for p in range(2))
    clock.now += 3599
    assert retentions.expire() == 0
    check(prefix)


def test_a_keys_retentions_count_distinct_blocks_and_the_soonest_to_end_make_room() -> None:
    retentions, prefix, clock = setup(max_tokens=12)
    kept = cached_prefix(prefix, list(range(16)))
    retentions.keep("a", kept[:2], ttl_s=3600)
    retentions.keep("a", kept[2:3], ttl_s=300)
    assert retentions.make_room("a", [kept[:3]]) == 0  # shares all three: 12 tokens in all
    assert retentions.make_room("b", [kept[:3]]) == 0  # another key's quota is its own
    assert retentions.make_room("a", [kept[3:4]]) == 1  # the one that ends first makes room
    assert retentions.tokens("a") == 8 and prefix.pool.num_held == 2
    with pytest.raises(RetentionLimit, match="max_retained_tokens_per_key"):
        retentions.make_room("a", [kept])  # alone past the quota: refused, nothing ended
    assert retentions.tokens("a") == 8
    clock.now += 3600
    assert retentions.make_room("a", [kept[1:4]]) == 0  # the expired one no longer counts
    assert len(retentions) == 0
    check(prefix)


def test_past_its_share_of_the_pool_a_retention_is_kept_by_its_files_alone() -> None:
    retentions, prefix, _ = setup(num_blocks=8, share=0.25)
    kept = cached_prefix(prefix, list(range(12)))  # 3 blocks, 2 allowed
    retentions.keep(None, kept, ttl_s=300)
    assert prefix.pool.num_held == 0
    assert retentions.protected() == frozenset(kept)
    check(prefix)


def test_letting_go_gives_the_pages_back_and_a_renewal_takes_them_again() -> None:
    retentions, prefix, _ = setup()
    kept = cached_prefix(prefix, list(range(8)))
    retentions.keep(None, kept, ttl_s=300)
    assert retentions.let_go() == 2 and prefix.pool.num_held == 0
    assert retentions.protected() == frozenset(kept)  # the disk still keeps them
    retentions.renew(None, kept)
    assert prefix.pool.num_held == 2
    check(prefix)
