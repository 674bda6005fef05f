"""Log probabilities from the samplers and the engine: a row that asks gets the model's log
probability of its token and its most likely alternatives; a row that does not ask gets what it
got before, whatever it is batched with; the torch and numpy samplers agree; and the engine
hands them on, one per token, without drafting for such a request."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from semantic.backends.mlx import sampling as mlx
from semantic.backends.torch import sampling as reference
from semantic.core import BatchItem, Request, SamplingParams, TokenEvent, TokenLogprob
from semantic.models.served import ServedModel
from tests.unit.fakes import make_engine

VOCAB = 50


def item(params: SamplingParams, seq_id: int = 0, generated: int = 0) -> BatchItem:
    return BatchItem(seq_id, [1], 5, [[0]], True, params, generated)


def random_logits(rows: int = 4, seed: int = 0) -> torch.Tensor:
    return torch.randn(rows, VOCAB, generator=torch.Generator().manual_seed(seed)) * 3


def test_a_greedy_row_gets_its_tokens_log_softmax_and_the_top_alternatives_in_order() -> None:
    logits = random_logits(rows=1)
    expected = logits[0].log_softmax(-1)
    [sampled] = reference.sample(logits.clone(), [item(SamplingParams(temperature=0, logprobs=3))])
    assert isinstance(sampled, TokenLogprob)
    assert sampled.token_id == int(expected.argmax())
    assert sampled.logprob == pytest.approx(float(expected.max()), abs=1e-5)
    values, ids = expected.topk(3)
    assert [t for t, _ in sampled.top] == ids.tolist()
    assert [v for _, v in sampled.top] == pytest.approx(values.tolist(), abs=1e-5)


def test_the_log_probabilities_are_the_models_before_the_penalty_and_the_temperature() -> None:
    logits = random_logits(rows=1, seed=3)
    params = SamplingParams(temperature=0.7, repetition_penalty=1.8, seed=5, logprobs=0)
    token_item = BatchItem(0, [1], 5, [[0]], True, params, 0, context_token_ids=[1, 2, 3])
    [sampled] = reference.sample(logits.clone(), [token_item])
    assert isinstance(sampled, TokenLogprob) and sampled.top == ()
    raw = logits[0].log_softmax(-1)
    assert sampled.logprob == pytest.approx(float(raw[sampled.token_id]), abs=1e-5)


def test_rows_that_do_not_ask_are_unchanged_by_rows_that_do() -> None:
    logits = random_logits(rows=4, seed=1)
    plain = [
        item(SamplingParams(temperature=0)),
        item(SamplingParams(temperature=1.0, seed=9), seq_id=1, generated=4),
        item(SamplingParams(temperature=0.8, top_k=5, seed=2), seq_id=2),
        item(SamplingParams(temperature=0, repetition_penalty=1.3), seq_id=3),
    ]
    alone = reference.sample(logits.clone(), plain)
    mixed = list(plain)
    mixed[2] = item(SamplingParams(temperature=0.8, top_k=5, seed=2, logprobs=5), seq_id=2)
    together = reference.sample(logits.clone(), mixed)
    assert [together[i] for i in (0, 1, 3)] == [alone[i] for i in (0, 1, 3)]
    assert isinstance(together[2], TokenLogprob) and together[2].token_id == alone[2]
    assert all(isinstance(token, int) for token in alone)


def test_each_row_gets_as_many_alternatives_as_it_asked() -> None:
    logits = random_logits(rows=3, seed=2)
    asks = [0, 7, 2]
    items = [item(SamplingParams(temperature=0, logprobs=n), seq_id=i) for i, n in enumerate(asks)]
    sampled = reference.sample(logits.clone(), items)
    assert [len(s.top) for s in sampled if isinstance(s, TokenLogprob)] == asks


def test_a_row_that_cannot_be_sampled_keeps_its_error_when_it_asked() -> None:
    logits = random_logits(rows=2)
    logits[1, 4] = float("nan")
    items = [item(SamplingParams(temperature=0, logprobs=2), seq_id=i) for i in range(2)]
    good, bad = reference.sample(logits, items)
    assert isinstance(good, TokenLogprob) and isinstance(bad, Exception)


@pytest.mark.parametrize("temperature", [0.0, 0.9])
def test_the_numpy_sampler_gives_what_the_torch_sampler_gives(temperature: float) -> None:
    logits = random_logits(rows=3, seed=4)
    items = [
        item(SamplingParams(temperature=temperature, seed=i, logprobs=n), seq_id=i)
        for i, n in enumerate([None, 4, 0])
    ]
    theirs = reference.sample(logits.clone(), items)
    ours = mlx.sample(logits.numpy().copy(), items)
    assert ours[0] == theirs[0]
    for mine, torch_one in zip(ours[1:], theirs[1:], strict=True):
        assert isinstance(mine, TokenLogprob) and isinstance(torch_one, TokenLogprob)
        assert mine.token_id == torch_one.token_id
        assert mine.logprob == pytest.approx(torch_one.logprob, abs=1e-5)
        assert [t for t, _ in mine.top] == [t for t, _ in torch_one.top]
        assert np.allclose([v for _, v in mine.top], [v for _, v in torch_one.top], atol=1e-5)


# -- the engine ------------------------------------------------------------------------------


def _request(i: int, **sampling: object) -> Request:
    prompt = [3 + (i * 13 + k) % 390 for k in range(10)]
    params = SamplingParams(**{"temperature": 0.0, "max_tokens": 6, **sampling})  # type: ignore[arg-type]
    return Request(f"r{i}", prompt, params)


def _collect(served: ServedModel, tmp_path: Path, requests: list[Request], **overrides: object):
    engine, _ = make_engine(served, tmp_path, **overrides)
    events: dict[str, list[TokenEvent]] = {r.request_id: [] for r in requests}
    for r in requests:
        engine.submit(r, events[r.request_id].append)
    engine.run_until_idle()
    return events


def test_the_engine_gives_one_log_probability_per_token_to_the_request_that_asked(
    served: ServedModel, tmp_path: Path
) -> None:
    events = _collect(served, tmp_path, [_request(0, logprobs=2), _request(1)])
    asked, plain = events["r0"], events["r1"]
    tokens = [t for e in asked for t in e.token_ids]
    logprobs = [lp for e in asked for lp in e.logprobs or ()]
    assert len(tokens) == 6 and [lp.token_id for lp in logprobs] == tokens
    assert all(len(lp.top) == 2 for lp in logprobs)
    assert all(e.logprobs is None for e in plain)


def test_asking_for_log_probabilities_changes_no_request_of_the_batch(
    served: ServedModel, tmp_path: Path
) -> None:
    def tokens(events: dict[str, list[TokenEvent]]) -> dict[str, list[int]]:
        return {rid: [t for e in evs for t in e.token_ids] for rid, evs in events.items()}

    plain = tokens(_collect(served, tmp_path / "a", [_request(i) for i in range(3)]))
    mixed = [_request(0), _request(1, logprobs=5), _request(2)]
    assert tokens(_collect(served, tmp_path / "b", mixed)) == plain


def test_a_request_that_asks_for_log_probabilities_gets_no_draft(
    served: ServedModel, tmp_path: Path
) -> None:
    def drafted(tmp: Path, **sampling: object) -> tuple[bool, list[TokenEvent]]:
        engine, runner = make_engine(served, tmp, speculative_tokens=4, ngram=1)
        got: list[TokenEvent] = []
        engine.submit(_request(0, max_tokens=20, **sampling), got.append)
        engine.run_until_idle()
        return any(i.draft_token_ids for step in runner.steps for i in step.items), got

    assert drafted(tmp_path / "plain")[0]  # the same request drafts when it does not ask
    asked, got = drafted(tmp_path / "asked", logprobs=1)
    assert not asked
    assert len([lp for e in got for lp in e.logprobs or ()]) == 20
