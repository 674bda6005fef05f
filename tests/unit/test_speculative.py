"""Speculative decoding in the engine, over the fake runner: drafts from the context change no
token, cache no rejected token, and stop, end and length cut inside an accepted run."""

from __future__ import annotations

import itertools
import statistics
from pathlib import Path

from semantic.backends.fake import FakeRunner
from semantic.cache.pages.block_pool import BlockPool
from semantic.cache.pages.prefix import PrefixCache, root_hash, split_key
from semantic.core import BatchItem, FinishReason, Request, SamplingParams, Sequence, TokenEvent
from semantic.engine.drafts import next_limit
from semantic.engine.engine import Engine
from semantic.engine.scheduler import DRAFT_UP_TO_DECODES, Scheduler
from semantic.models.served import ServedModel
from tests.unit.fakes import make_engine
from tests.unit.test_engine import collect

# A prompt that repeats itself, so drafts are found from the start.
LOOP = [40, 41, 42, 43, 44, 45, 46]


def request(i: int, prompt: list[int] | None = None, **sampling: object) -> Request:
    prompt = prompt or [3 + (i * 13 + k) % 390 for k in range(5)] + LOOP * 3
    params = SamplingParams(**{"temperature": 0.0, "max_tokens": 40, **sampling})  # type: ignore[arg-type]
    return Request(f"r{i}", list(prompt), params)


Answer = tuple[list[int], str, FinishReason | None, int]


def answer(events: list[TokenEvent]) -> Answer:
    """What a client sees of a request: tokens, text, why it ended, tokens it is billed."""
    final = events[-1]
    assert final.usage is not None
    tokens = [t for e in events for t in e.token_ids]
    text = "".join(e.text for e in events)
    return tokens, text, final.finish_reason, final.usage.completion_tokens


def outcomes(
    served: ServedModel, cache_dir: Path, requests: list[Request], draft: int, **runner: object
) -> tuple[dict[str, Answer], Engine, FakeRunner]:
    engine, fake = make_engine(served, cache_dir, speculative_tokens=draft, **runner)
    events = collect(engine, requests)
    engine.pool.check_integrity()
    assert engine.pool.num_held == 0
    assert_cache_holds_its_tokens(engine, fake)
    return {rid: answer(evs) for rid, evs in events.items()}, engine, fake


def assert_cache_holds_its_tokens(engine: Engine, runner: FakeRunner) -> None:
    """Every page the prefix cache indexes holds the K/V of exactly the tokens it is indexed
    under (the fake runner's K/V are the token ids): no rejected draft token was cached."""
    size = runner.cache_spec.block_tokens
    checked = 0
    for page in range(engine.pool.num_blocks):
        key = engine.pool.hash_of(page)
        if key is None:
            continue
        content = engine.prefix.content(split_key(key)[0])
        assert content is not None
        tokens = list(content[1])
        assert runner.slots[page * size : page * size + len(tokens)] == tokens
        checked += 1
    assert checked, "nothing was cached"


def drafted_steps(runner: FakeRunner) -> int:
    return sum(1 for batch in runner.steps for item in batch.items if item.draft_token_ids)


def test_greedy_output_is_the_same_with_drafts_accepted(
    served: ServedModel, tmp_path: Path
) -> None:
    requests = [request(i) for i in range(2)]
    plain, _, _ = outcomes(served, tmp_path / "a", requests, 0, ngram=1)
    fast, engine, runner = outcomes(served, tmp_path / "b", requests, 6, ngram=1)
    assert fast == plain
    accepted = engine.metrics.draft_accepted_tokens._value.get()
    assert accepted > 20, "the n-gram model's loops were not drafted"
    assert engine.metrics.draft_tokens._value.get() >= accepted
    # Tokens gained: fewer steps than tokens.
    assert len(runner.steps) < sum(n for _, _, _, n in plain.values())


def test_greedy_output_is_the_same_with_drafts_mostly_rejected(
    served: ServedModel, tmp_path: Path
) -> None:
    # Five token ids: their pairs recur all the time, but each token is a hash of all the
    # context, so a draft token is right one time in five.
    requests = [request(i) for i in range(2)]
    plain, _, _ = outcomes(served, tmp_path / "a", requests, 0, vocab_size=8)
    fast, engine, runner = outcomes(served, tmp_path / "b", requests, 4, vocab_size=8)
    assert fast == plain
    assert drafted_steps(runner) > 10
    drafted = engine.metrics.draft_tokens._value.get()
    assert 0 < engine.metrics.draft_accepted_tokens._value.get() < drafted / 2
    # Drafts that miss get shorter: each is one past the run the last one got right (with the
    # longest draft every time they averaged 3.25 tokens here).
    lengths = [len(item.draft_token_ids) for item in drafted_items(runner)]
    assert statistics.mean(lengths) < 2


def test_a_draft_limit_doubles_after_a_draft_taken_whole_and_shrinks_after_a_miss() -> None:
    assert next_limit(2, 2, 2, 8) == 4
    assert next_limit(8, 3, 3, 8) == 8  # a short draft taken whole: the limit stays
    assert next_limit(8, 8, 0, 8) == 1
    assert next_limit(8, 8, 5, 8) == 6


def test_drafts_wait_while_many_sequences_decode(served: ServedModel, tmp_path: Path) -> None:
    requests = [request(i) for i in range(DRAFT_UP_TO_DECODES + 2)]
    plain, _, _ = outcomes(served, tmp_path / "a", requests, 0, ngram=1)
    fast, _, runner = outcomes(served, tmp_path / "b", requests, 4, ngram=1)
    assert fast == plain
    for batch in runner.steps:
        decodes = [item for item in batch.items if item.sample and item.start_pos > 20]
        if len(decodes) > DRAFT_UP_TO_DECODES:
            assert not any(item.draft_token_ids for item in batch.items)


def test_a_stop_token_inside_an_accepted_run_ends_it_there(
    served: ServedModel, tmp_path: Path
) -> None:
    free, _, runner = outcomes(served, tmp_path / "a", [request(0)], 6, ngram=1)
    tokens = free["r0"][0]
    # A token the first time it comes, with more of its step's run after it.
    stop_at = next(i for i in _inside_runs(runner, len(request(0).prompt_token_ids)))
    stop = tokens[stop_at]
    first = tokens.index(stop)
    for draft in (0, 6):
        cut, _, _ = outcomes(
            served, tmp_path / f"s{draft}", [request(0, stop_token_ids=(stop,))], draft, ngram=1
        )
        assert cut["r0"][0] == tokens[: first + 1]
        assert cut["r0"][2] is FinishReason.STOP and cut["r0"][3] == first + 1


def _inside_runs(runner: FakeRunner, prompt_len: int) -> list[int]:
    """Output indexes of tokens a draft's step gave with more tokens after them."""
    items = [item for batch in runner.steps for item in batch.items if item.sample]
    inside: list[int] = []
    for item, after in itertools.pairwise(items):
        if item.draft_token_ids:  # its run gave the tokens at item.start_pos + 1 .. after
            inside += range(item.start_pos + 1 - prompt_len, after.start_pos - prompt_len)
    assert inside, "no run of more than one token"
    return inside


def test_stop_strings_and_max_tokens_cut_a_run_as_they_cut_single_tokens(
    served: ServedModel, tmp_path: Path
) -> None:
    free, _, _ = outcomes(served, tmp_path / "free", [request(0)], 0, ngram=1)
    text = free["r0"][1]
    stops = [text[i : i + 2] for i in range(3, len(text) - 2, 5)]
    requests = [request(i, stop=(s,)) for i, s in enumerate(stops)]
    requests += [request(100 + n, max_tokens=n) for n in (1, 2, 7, 13)]
    for r in requests[-4:]:
        r.prompt_token_ids[:] = requests[0].prompt_token_ids
    plain: dict[str, Answer] = {}
    for r in requests:  # one at a time: alone, every request drafts
        plain |= outcomes(served, tmp_path / f"p{r.request_id}", [r], 0, ngram=1)[0]
        fast = outcomes(served, tmp_path / f"f{r.request_id}", [r], 6, ngram=1)[0]
        assert fast[r.request_id] == plain[r.request_id], r.sampling
    assert any(reason is FinishReason.STOP for _, _, reason, _ in plain.values())


def test_a_continuation_reuses_the_cache_a_speculative_turn_left(
    served: ServedModel, tmp_path: Path
) -> None:
    engine, runner = make_engine(served, tmp_path, speculative_tokens=6)
    first = request(0)
    [events] = collect(engine, [first]).values()
    turn = first.prompt_token_ids + [t for e in events for t in e.token_ids] + LOOP
    [events] = collect(engine, [request(1, prompt=turn)]).values()
    final = events[-1]
    assert final.usage is not None and final.usage.cached_tokens >= len(turn) - len(LOOP) - 8
    fresh, _ = make_engine(served, tmp_path / "fresh")
    [again] = collect(fresh, [request(1, prompt=turn)]).values()
    assert answer(events)[0] == answer(again)[0]
    assert_cache_holds_its_tokens(engine, runner)


def drafted_items(runner: FakeRunner) -> list[BatchItem]:
    return [item for batch in runner.steps for item in batch.items if item.draft_token_ids]


def test_a_row_with_a_repetition_penalty_drafts_with_its_context_for_the_verifier(
    served: ServedModel, tmp_path: Path
) -> None:
    _, _, runner = outcomes(served, tmp_path, [request(0, repetition_penalty=1.2)], 6, ngram=1)
    assert drafted_items(runner)
    assert all(item.context_token_ids for item in drafted_items(runner))


def test_a_row_drafts_only_from_its_min_tokens_on_so_no_draft_position_is_suppressed(
    served: ServedModel, tmp_path: Path
) -> None:
    """Before min_tokens its end tokens are suppressed; a draft starts at or after it, so
    every position it covers samples as plain decoding there would, with nothing suppressed."""
    for min_tokens in (40, 12):
        req = request(min_tokens, min_tokens=min_tokens, max_tokens=40)
        plain, _, _ = outcomes(served, tmp_path / f"plain{min_tokens}", [req], 0, ngram=1)
        drafted, _, runner = outcomes(served, tmp_path / f"d{min_tokens}", [req], 6, ngram=1)
        assert drafted == plain
        items = drafted_items(runner)
        assert all(item.num_output_tokens >= min_tokens for item in items)
        assert not any(item.suppress_token_ids for item in items)
        assert bool(items) == (min_tokens < 40)


def test_a_draft_stops_short_of_max_tokens() -> None:
    for max_tokens in (2, 5, 9):
        reach = [before + len(draft) for before, draft in _drafts(max_tokens)]
        assert all(n < max_tokens for n in reach)


def test_drafts_stay_within_the_step_budget() -> None:
    lengths = [len(draft) for _, draft in _drafts(40, max_batch_tokens=16)]
    assert max(lengths) <= 16 // DRAFT_UP_TO_DECODES - 1
    scheduler = _scheduler(max_batch_tokens=16)
    req = request(0, max_tokens=100)
    seq = Sequence(0, req, list(req.prompt_token_ids), len(req.prompt_token_ids))
    assert scheduler._draft_room(seq) == 16 // DRAFT_UP_TO_DECODES - 1
    assert _scheduler(max_batch_tokens=512)._draft_room(seq) == 20


def _drafts(max_tokens: int, max_batch_tokens: int = 32) -> list[tuple[int, tuple[int, ...]]]:
    """(output tokens before the step, the draft) of each step of one request alone, drafts of
    up to 20 tokens: the scheduler and the fake runner without the engine."""
    runner = FakeRunner(num_blocks=32, block_tokens=4, ngram=1)
    scheduler = _scheduler(max_batch_tokens)
    req = request(0, max_tokens=max_tokens)
    seq = Sequence(0, req, list(req.prompt_token_ids), len(req.prompt_token_ids))
    scheduler.add(seq)
    drafts = []
    while seq.num_output_tokens < max_tokens:
        batch = scheduler.schedule()
        drafts += [(seq.num_output_tokens, item.draft_token_ids) for item in batch.items]
        for s, run in scheduler.update(batch, runner.run(batch)):
            for token in run[1:]:
                scheduler.accept(s, token)
    assert seq.num_output_tokens == max_tokens
    return drafts


def _scheduler(max_batch_tokens: int) -> Scheduler:
    prefix = PrefixCache(BlockPool(32), 4, root_hash("t"))
    return Scheduler(
        prefix,
        block_tokens=4,
        max_running=4,
        max_batch_tokens=max_batch_tokens,
        speculative_tokens=20,
    )


def test_a_row_held_to_a_grammar_drafts_and_gives_the_tokens_of_no_drafts(
    served: ServedModel, tmp_path: Path
) -> None:
    """JSON with a free string: the grammar moves most of the looping fake's tokens (to the
    next id it allows), and inside the string the output loops, so drafts are accepted. Each
    token, drafted or not, is the one the grammar leaves at its position, and the matcher
    keeps step with the output."""
    schema = {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]}
    req = request(0, grammar=served.grammars.json_schema(schema))
    plain, _, _ = outcomes(served, tmp_path / "plain", [req], 0, ngram=1)
    drafted, engine, runner = outcomes(served, tmp_path / "drafts", [req], 6, ngram=1)
    assert drafted == plain
    assert drafted_items(runner)
    assert engine.metrics.draft_accepted_tokens._value.get() > 0
