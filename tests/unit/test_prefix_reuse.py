"""Prefix reuse through the scheduler and the fake runner: what is reused, and that reusing it
changes no output (the fake runner reads its context back through the block tables)."""

from __future__ import annotations

from semantic.backends.fake import FakeRunner
from semantic.cache.pages.block_pool import TIER_ONE_OFF, TIER_WORKING_AGENT, BlockPool
from semantic.cache.pages.prefix import PrefixCache, chain_hash, root_hash
from semantic.core import FinishReason, Request, SamplingParams, Sequence
from semantic.engine.scheduler import Scheduler

BLOCK = 4


def make(num_blocks: int = 64) -> tuple[Scheduler, FakeRunner]:
    runner = FakeRunner(num_blocks=num_blocks, block_tokens=BLOCK)
    prefix = PrefixCache(BlockPool(num_blocks), BLOCK, root_hash("test-model"))
    return Scheduler(prefix, block_tokens=BLOCK, max_running=8, max_batch_tokens=64), runner


_ids = iter(range(10**6))


def run(
    scheduler: Scheduler,
    runner: FakeRunner,
    prompts: list[list[int]],
    max_tokens: int = 6,
    agent: str | None = "agent",
) -> list[Sequence]:
    seqs = []
    for prompt in prompts:
        seq_id = next(_ids)
        request = Request(
            f"r{seq_id}", list(prompt), SamplingParams(max_tokens=max_tokens), agent_id=agent
        )
        seqs.append(Sequence(seq_id, request, list(prompt), len(prompt)))
        scheduler.add(seqs[-1])
    while scheduler.has_work:
        batch = scheduler.schedule()
        for seq, _ in scheduler.update(batch, runner.run(batch)):
            if seq.num_output_tokens >= max_tokens:
                scheduler.finish(seq, FinishReason.LENGTH)
        scheduler.pool.check_integrity()
        scheduler.prefix.check_integrity()
    return seqs


def fresh_output(prompt: list[int], max_tokens: int = 6) -> list[int]:
    scheduler, runner = make()
    return run(scheduler, runner, [prompt], max_tokens)[0].output_token_ids


PROMPT = [100 + i for i in range(37)]


def test_a_continuing_agent_reuses_its_whole_computed_history() -> None:
    scheduler, runner = make()
    [first] = run(scheduler, runner, [PROMPT])
    history = first.token_ids  # the prompt and the 6 generated tokens (the last one uncomputed)
    follow_up = [*history, 500, 501, 502]
    [second] = run(scheduler, runner, [follow_up])
    assert second.num_cached_tokens == len(history) - 1
    assert second.output_token_ids == fresh_output(follow_up)


def test_the_last_prompt_token_is_never_served_from_cache() -> None:
    scheduler, runner = make()
    run(scheduler, runner, [PROMPT])
    [again] = run(scheduler, runner, [PROMPT])
    assert again.num_cached_tokens == len(PROMPT) - 1
    assert again.output_token_ids == fresh_output(PROMPT)


def test_a_prompt_ending_on_a_block_boundary_reuses_all_but_its_last_token() -> None:
    prompt = PROMPT[:32]
    scheduler, runner = make()
    run(scheduler, runner, [prompt])
    [again] = run(scheduler, runner, [prompt])
    assert again.num_cached_tokens == 31
    assert again.output_token_ids == fresh_output(prompt)


def test_a_shared_system_prompt_is_stored_once() -> None:
    system = [7000 + i for i in range(40)]  # ten full blocks
    prompts = [[*system, 900 + agent, 901, 902] for agent in range(10)]
    scheduler, runner = make()
    run(scheduler, runner, prompts[:1])
    later = run(scheduler, runner, prompts[1:])
    assert all(seq.num_cached_tokens == 40 for seq in later)
    parent, blocks = scheduler.prefix.root, set()
    for start in range(0, 40, BLOCK):
        parent = chain_hash(parent, system[start : start + BLOCK])
        blocks.add(scheduler.pool.lookup(parent))
    assert None not in blocks and len(blocks) == 10
    assert [s.output_token_ids for s in later] == [fresh_output(p) for p in prompts[1:]]


def test_two_requests_continuing_one_history_copy_its_partial_block() -> None:
    scheduler, runner = make()
    [first] = run(scheduler, runner, [PROMPT])
    a, b = [*first.token_ids, 1, 2, 3], [*first.token_ids, 4, 5]
    seqs = run(scheduler, runner, [a, b])
    assert all(seq.num_cached_tokens == len(first.token_ids) - 1 for seq in seqs)
    assert sum(len(batch.copies) for batch in runner.steps) == 2
    assert [s.output_token_ids for s in seqs] == [fresh_output(a), fresh_output(b)]


def test_a_diverging_prompt_reuses_the_common_part_of_a_full_block() -> None:
    scheduler, runner = make()
    run(scheduler, runner, [PROMPT])
    diverging = [*PROMPT[:18], 999, 998, 997]  # shares 4 full blocks and 2 tokens of the 5th
    [seq] = run(scheduler, runner, [diverging])
    assert seq.num_cached_tokens == 18
    assert seq.output_token_ids == fresh_output(diverging)


def test_one_off_requests_never_evict_a_working_agents_cache() -> None:
    scheduler, runner = make(num_blocks=12)
    [agent] = run(scheduler, runner, [PROMPT], agent="worker")  # 43 tokens: 11 blocks cached
    assert scheduler.pool.num_cached == 11
    hashes = [scheduler.prefix.pool.hash_of(b) or 0 for b in scheduler.pool.cached_blocks()]
    assert {scheduler.pool.tier_of(b) for b in scheduler.pool.cached_blocks()} == {
        TIER_WORKING_AGENT
    }
    side = Request("side", [5, 6, 7, 8, 9, 10, 11, 12], SamplingParams(max_tokens=2))
    seq = Sequence(999_999, side, list(side.prompt_token_ids), 8)
    scheduler.add(seq)
    assert not scheduler.schedule(), "a one-off request took a working agent's blocks"
    assert [scheduler.pool.lookup(h) is not None for h in hashes] == [True] * 11
    scheduler.finish(seq, FinishReason.ABORT)
    [later] = run(scheduler, runner, [[*agent.token_ids, 1]], max_tokens=2, agent="worker")
    assert later.num_cached_tokens == len(agent.token_ids) - 1


def test_one_off_blocks_are_reclaimed_before_an_agents() -> None:
    scheduler, runner = make(num_blocks=20)
    run(scheduler, runner, [[300 + i for i in range(16)]], max_tokens=1, agent="worker")
    worker_hashes = {scheduler.pool.hash_of(b) for b in scheduler.pool.cached_blocks()}
    run(scheduler, runner, [[600 + i for i in range(16)]], max_tokens=1, agent=None)
    tiers = [scheduler.pool.tier_of(b) for b in scheduler.pool.cached_blocks()]
    assert tiers == [TIER_ONE_OFF] * 4 + [TIER_WORKING_AGENT] * 4  # reclaim order
    # 16 blocks: the 12 free ones, then the one-off request's 4, not the agent's.
    run(scheduler, runner, [[900 + i for i in range(64)]], max_tokens=1, agent="other")
    remaining = {scheduler.pool.hash_of(b) for b in scheduler.pool.cached_blocks()}
    assert worker_hashes <= remaining
    assert TIER_ONE_OFF not in {scheduler.pool.tier_of(b) for b in scheduler.pool.cached_blocks()}


def test_a_one_off_request_reusing_an_agents_blocks_leaves_them_in_the_agents_tier() -> None:
    scheduler, runner = make()
    run(scheduler, runner, [PROMPT], agent="worker")
    agent_blocks = set(scheduler.pool.cached_blocks())
    [side] = run(scheduler, runner, [[*PROMPT[:20], 999]], agent=None)
    assert side.num_cached_tokens == 20
    assert {scheduler.pool.tier_of(b) for b in agent_blocks} == {TIER_WORKING_AGENT}
