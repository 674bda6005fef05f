"""Pins over a real pool: each pinned page carries one reference taken by the pin, a new hold
takes its pages before letting go of the old ones, and an owner's pins stay within its share."""

from __future__ import annotations

from semantic.cache.agents.pins import Pins
from semantic.cache.pages.block_pool import TIER_ONE_OFF, TIER_WORKING_AGENT, BlockPool
from semantic.core import AgentKey

ALICE, ALICE_2, BOB = AgentKey("a", "alice"), AgentKey("b", "alice"), AgentKey("c", "bob")


def cached_pages(pool: BlockPool, count: int) -> list[int]:
    """`count` pages holding content (hashed), cached as a one-off's: as a finished turn's."""
    pages = pool.allocate(count)
    for page in pages:
        pool.set_hash(page, 1000 + page)
    pool.release(pages, TIER_ONE_OFF)
    return pages


def test_a_pin_holds_its_pages_once_and_lets_go_to_the_working_tier() -> None:
    pool = BlockPool(8)
    pages = cached_pages(pool, 3)
    pins = Pins(pool, max_share=1.0)
    pins.hold(ALICE, pages)
    pins.hold(ALICE, pages[1:])  # its next history: one page fewer
    assert [pool.refcount(page) for page in pages] == [0, 1, 1]
    assert pool.tier_of(pages[0]) == TIER_WORKING_AGENT
    pins.drop(ALICE)
    assert [pool.tier_of(page) for page in pages] == [TIER_WORKING_AGENT] * 3
    assert ALICE not in pins.held
    pool.check_integrity()


def test_letting_go_of_every_pin_counts_the_pages_and_keeps_the_agents() -> None:
    pool = BlockPool(8)
    pages = cached_pages(pool, 3)
    pins = Pins(pool, max_share=1.0)
    pins.hold(ALICE, pages[:2])
    pins.hold(BOB, pages[2:])
    assert pins.let_go() == 3
    assert pins.held == {ALICE: [], BOB: []}
    assert pool.num_held == 0
    pool.check_integrity()


def test_an_owner_s_pins_fit_within_its_share_of_the_pool() -> None:
    pool = BlockPool(10)
    pages = cached_pages(pool, 6)
    pins = Pins(pool, max_share=0.5)
    pins.hold(ALICE, pages[:3])
    pins.hold(BOB, pages[3:6])  # another owner's: not counted against alice
    assert pins.fits(ALICE_2, 2)
    assert not pins.fits(ALICE_2, 3)
    assert pins.fits(ALICE, 5)  # in place of its own three
    pool.check_integrity()
