"""The scheduler against the fake runner: batching, chunked prefill, which prompt goes first,
admission, preemption."""

from __future__ import annotations

from semantic.backends.fake import FakeRunner
from semantic.cache.pages.block_pool import BlockPool
from semantic.cache.pages.prefix import PrefixCache, root_hash
from semantic.core import FinishReason, Request, SamplingParams, Sequence, SequenceStatus
from semantic.engine.scheduler import PREFILL_SHARE_WHILE_DECODING, Scheduler


def make_seq(seq_id: int, prompt_len: int, max_tokens: int = 8) -> Sequence:
    prompt = [10 + (seq_id * 7 + i) % 50 for i in range(prompt_len)]
    request = Request(f"r{seq_id}", prompt, SamplingParams(temperature=0, max_tokens=max_tokens))
    return Sequence(seq_id, request, list(prompt), prompt_len)


def run_to_completion(
    scheduler: Scheduler, runner: FakeRunner, seqs: list[Sequence]
) -> dict[int, list[int]]:
    for seq in seqs:
        scheduler.add(seq)
    for _ in range(10_000):
        if not scheduler.has_work:
            break
        batch = scheduler.schedule()
        assert batch, "work is left but nothing was scheduled"
        for seq, _token in scheduler.update(batch, runner.run(batch)):
            if seq.num_output_tokens >= seq.request.sampling.max_tokens:
                scheduler.finish(seq, FinishReason.LENGTH)
        scheduler.pool.check_integrity()
    return {seq.seq_id: seq.output_token_ids for seq in seqs}


def make(num_blocks: int = 64, block_tokens: int = 4, max_batch_tokens: int = 16):
    runner = FakeRunner(num_blocks=num_blocks, block_tokens=block_tokens)
    prefix = PrefixCache(BlockPool(num_blocks), block_tokens, root_hash("test"))
    scheduler = Scheduler(
        prefix, block_tokens=block_tokens, max_running=8, max_batch_tokens=max_batch_tokens
    )
    return scheduler, runner


def solo_outputs(lengths: list[int], max_tokens: int = 8) -> dict[int, list[int]]:
    outputs: dict[int, list[int]] = {}
    for seq_id, length in enumerate(lengths):
        scheduler, runner = make()
        outputs |= run_to_completion(scheduler, runner, [make_seq(seq_id, length, max_tokens)])
    return outputs


def test_batched_sequences_get_the_tokens_they_get_alone() -> None:
    lengths = [3, 17, 5, 40, 1, 9, 23, 4]
    scheduler, runner = make()
    together = run_to_completion(scheduler, runner, [make_seq(i, n) for i, n in enumerate(lengths)])
    assert together == solo_outputs(lengths)
    assert max(len(batch.items) for batch in runner.steps) > 1, "nothing was batched"
    assert scheduler.pool.num_held == 0


def test_a_long_prompt_is_prefilled_in_chunks_beside_running_decodes() -> None:
    scheduler, runner = make(max_batch_tokens=16)
    short, long = make_seq(0, 3, max_tokens=20), make_seq(1, 60)
    scheduler.add(short)
    batch = scheduler.schedule()
    scheduler.update(batch, runner.run(batch))
    scheduler.add(long)
    chunk_sizes = []
    while long.in_prefill:
        batch = scheduler.schedule()
        assert batch.num_tokens <= 16
        assert any(item.seq_id == short.seq_id for item in batch.items), "decode stalled"
        chunk_sizes += [len(i.token_ids) for i in batch.items if i.seq_id == long.seq_id]
        scheduler.update(batch, runner.run(batch))
    assert sum(chunk_sizes) == 60 and len(chunk_sizes) >= 4


def first_token_steps(
    scheduler: Scheduler, runner: FakeRunner, arrivals: dict[int, list[Sequence]], steps: int
) -> dict[int, int]:
    """Run `steps` steps, adding `arrivals[step]` before each; the step at which each sequence
    got its first token."""
    first: dict[int, int] = {}
    for step in range(steps):
        for seq in arrivals.get(step, []):
            scheduler.add(seq)
        batch = scheduler.schedule()
        for seq, _token in scheduler.update(batch, runner.run(batch)):
            first.setdefault(seq.seq_id, step)
            if seq.num_output_tokens >= seq.request.sampling.max_tokens:
                scheduler.finish(seq, FinishReason.LENGTH)
        scheduler.pool.check_integrity()
    return first


def test_a_decode_waits_for_at_most_one_capped_chunk_of_a_long_prompt() -> None:
    scheduler, runner = make(max_batch_tokens=16)
    cap = int(16 * PREFILL_SHARE_WHILE_DECODING)
    decoding, long = make_seq(0, 3, max_tokens=40), make_seq(1, 60)
    first_token_steps(scheduler, runner, {0: [decoding]}, steps=1)
    scheduler.add(long)
    while long.in_prefill:
        batch = scheduler.schedule()
        chunk = [len(i.token_ids) for i in batch.items if i.seq_id == long.seq_id]
        assert any(item.seq_id == decoding.seq_id for item in batch.items), "decode stalled"
        assert chunk and chunk[0] <= cap, "a decode waited for more than one capped chunk"
        scheduler.update(batch, runner.run(batch))


def test_a_prompt_alone_is_computed_a_whole_step_at_a_time() -> None:
    scheduler, runner = make(max_batch_tokens=16)
    first_token_steps(scheduler, runner, {0: [make_seq(0, 60, max_tokens=1)]}, steps=5)
    assert [batch.num_tokens for batch in runner.steps[:4]] == [16, 16, 16, 12]


def test_a_short_prompt_that_arrives_behind_a_long_one_gets_its_first_token_first() -> None:
    scheduler, runner = make(max_batch_tokens=16)
    long, short = make_seq(0, 60, max_tokens=1), make_seq(1, 5, max_tokens=1)
    first = first_token_steps(scheduler, runner, {0: [long], 1: [short]}, steps=8)
    assert first[short.seq_id] == 1, "the short prompt waited for the long one"
    assert first[long.seq_id] == 4  # one step later than alone: the short prompt's five tokens


def test_a_stream_of_short_prompts_does_not_starve_a_long_one() -> None:
    scheduler, runner = make(max_batch_tokens=16)
    long = make_seq(0, 40, max_tokens=1)
    # Three 6-token prompts a step: more than a step computes, so shortest-first alone would
    # never come back to the long prompt.
    shorts = {step: [make_seq(3 * step + k, 6, max_tokens=1) for k in range(1, 4)]
              for step in range(1, 30)}  # fmt: skip
    first = first_token_steps(scheduler, runner, {0: [long], **shorts}, steps=30)
    assert first[long.seq_id] <= 12, "newer short prompts starved the long one"
    assert first[4] <= 3, "short prompts did not go first at all"


def test_a_short_prompt_is_not_held_behind_a_long_one_moved_up_for_waiting() -> None:
    """A long prompt overtaken for long enough goes first; it still leaves room in each step
    for a prompt of a few tokens (a returning agent's turn) that arrives meanwhile."""
    scheduler, runner = make(num_blocks=256, max_batch_tokens=16)
    long = make_seq(0, 100, max_tokens=1)
    # Two 8-token prompts a step fill every step, overtaking the long one for 20 steps.
    newer = {step: [make_seq(100 + 2 * step + k, 8, max_tokens=1) for k in range(2)]
             for step in range(1, 21)}  # fmt: skip
    short = make_seq(1, 5, max_tokens=1)
    first = first_token_steps(scheduler, runner, {0: [long], **newer, 21: [short]}, steps=30)
    assert first[short.seq_id] == 21, "the short prompt waited behind the long one"
    moved_up = [len(item.token_ids) for item in runner.steps[21].items if item.seq_id == 0]
    assert moved_up and moved_up[0] >= 8, "the long one got less than half the step"
    assert first[long.seq_id] <= 27


def test_requests_wait_while_the_pool_is_full_and_run_when_it_frees() -> None:
    scheduler, runner = make(num_blocks=6, block_tokens=4)
    seqs = [make_seq(i, 10, max_tokens=4) for i in range(3)]  # 3 blocks each; 2 fit at once
    outputs = run_to_completion(scheduler, runner, seqs)
    assert outputs == solo_outputs([10, 10, 10], max_tokens=4)
    assert max(len(batch.items) for batch in runner.steps) <= 2


def test_pool_exhaustion_mid_decode_preempts_the_newest_and_recomputes_it() -> None:
    # Two sequences that each fit alone but outgrow the pool together while decoding.
    scheduler, runner = make(num_blocks=8, block_tokens=4)
    seqs = [make_seq(i, 8, max_tokens=12) for i in range(2)]
    outputs = run_to_completion(scheduler, runner, seqs)
    assert outputs == solo_outputs([8, 8], max_tokens=12)
    recomputed = [i for b in runner.steps for i in b.items if i.start_pos == 0 and i.seq_id == 1]
    assert len(recomputed) >= 2, "the newest sequence was never preempted"


def test_finishing_a_waiting_or_running_sequence_frees_its_blocks() -> None:
    scheduler, runner = make(num_blocks=4, block_tokens=4)
    running, waiting = make_seq(0, 12), make_seq(1, 12)
    scheduler.add(running)
    scheduler.add(waiting)
    scheduler.update(batch := scheduler.schedule(), runner.run(batch))
    assert running.status is SequenceStatus.RUNNING and waiting.status is SequenceStatus.WAITING
    scheduler.finish(waiting, FinishReason.ABORT)
    scheduler.finish(running, FinishReason.ABORT)
    assert not scheduler.has_work and scheduler.pool.num_held == 0
    scheduler.pool.check_integrity()


def test_end_tokens_are_suppressed_until_min_tokens() -> None:
    scheduler, runner = make()
    scheduler.end_token_ids = (5,)
    seq = make_seq(0, 3)
    seq.request.sampling = SamplingParams(min_tokens=2, stop_token_ids=(9,))
    scheduler.add(seq)
    items = []
    for _ in range(3):
        batch = scheduler.schedule()
        items += batch.items
        scheduler.update(batch, runner.run(batch))
    assert [i.suppress_token_ids for i in items] == [(5, 9), (5, 9), ()]


def test_a_row_with_a_repetition_penalty_reads_its_whole_context_and_others_none() -> None:
    scheduler, runner = make()
    penalized, plain = make_seq(0, 3), make_seq(1, 3)
    penalized.request.sampling = SamplingParams(repetition_penalty=1.1)
    scheduler.add(penalized)
    scheduler.add(plain)
    for _ in range(2):
        batch = scheduler.schedule()
        contexts = {item.seq_id: list(item.context_token_ids) for item in batch.items}
        assert contexts == {0: penalized.token_ids, 1: []}
        scheduler.update(batch, runner.run(batch))
    assert len(penalized.token_ids) == 5  # the second step's context held the first output


def test_waiting_requests_expire_after_the_queue_timeout() -> None:
    scheduler, _ = make(num_blocks=2, block_tokens=4)
    seq = make_seq(0, 30)  # can never be admitted into 2 blocks
    scheduler.add(seq)
    scheduler.schedule()
    now = seq.request.arrival_time
    assert scheduler.expired(5.0, now=now + 1) == []
    assert scheduler.expired(5.0, now=now + 6) == [seq]
