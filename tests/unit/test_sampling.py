"""Sampling: greedy is argmax, seeded draws are reproducible, top-k and top-p keep the right set,
and a hostile value or a broken row gives that row an error at most, never the batch."""

from __future__ import annotations

import pytest
import torch

from semantic.backends.torch.sampling import Unsampleable, candidates, draw, sample
from semantic.core import GREEDY_BELOW_TEMPERATURE, BatchItem, SamplingParams

VOCAB = 50


def item(params: SamplingParams, num_output_tokens: int = 0) -> BatchItem:
    return BatchItem(0, [1], 5, [[0]], True, params, num_output_tokens)


def random_logits(rows: int = 4, seed: int = 0) -> torch.Tensor:
    return torch.randn(rows, VOCAB, generator=torch.Generator().manual_seed(seed)) * 3


def test_greedy_returns_the_argmax_of_each_row():
    logits = random_logits()
    tokens = sample(logits, [item(SamplingParams(temperature=0.0))] * 4)
    assert tokens == logits.argmax(-1).tolist()


def test_top_k_one_is_greedy_at_any_temperature():
    logits = random_logits()
    params = SamplingParams(temperature=1.5, top_k=1)
    assert sample(logits, [item(params)] * 4) == logits.argmax(-1).tolist()


def test_seeded_draw_depends_only_on_seed_and_position():
    logits = random_logits(rows=1)[0]
    params = SamplingParams(temperature=1.0, seed=1234)
    first = [draw(logits.clone(), params, n) for n in range(20)]
    again = [draw(logits.clone(), params, n) for n in range(20)]
    assert first == again
    assert len(set(first)) > 1  # each position draws afresh, not one repeated token


def test_seeded_row_gives_the_same_token_whatever_it_is_batched_with():
    logits = random_logits(rows=3)
    seeded = item(SamplingParams(temperature=1.0, seed=7), num_output_tokens=3)
    alone = sample(logits[1:2].clone(), [seeded])
    others = [item(SamplingParams(temperature=1.0)), seeded, item(SamplingParams(temperature=0))]
    batched = sample(logits.clone(), others)
    assert batched[1] == alone[0]


def test_different_seeds_give_different_streams():
    logits = torch.zeros(VOCAB)
    a = [draw(logits, SamplingParams(seed=1), n) for n in range(10)]
    b = [draw(logits, SamplingParams(seed=2), n) for n in range(10)]
    assert a != b


def test_top_p_keeps_the_smallest_prefix_reaching_the_mass():
    probs = torch.tensor([0.05, 0.5, 0.15, 0.3])
    kept, ids = candidates(probs.log(), top_k=0, top_p=0.7)
    assert ids is not None
    assert ids.tolist() == [1, 3]  # 0.5 < 0.7 before the second; 0.8 >= 0.7 before the third
    torch.testing.assert_close(kept, torch.tensor([0.5, 0.3]))


def test_top_p_draws_only_from_the_nucleus():
    probs = torch.tensor([0.05, 0.5, 0.15, 0.3])
    params = SamplingParams(temperature=1.0, top_p=0.7, seed=0)
    drawn = {draw(probs.log(), params, n) for n in range(200)}
    assert drawn == {1, 3}


def test_top_p_wider_than_the_candidate_window_sorts_the_whole_vocabulary():
    logits = torch.zeros(4096)  # flat: the nucleus for 0.9 is 3,687 tokens
    kept, ids = candidates(logits, top_k=0, top_p=0.9)
    assert ids is not None
    assert len(kept) == 3687
    assert float(kept.sum()) >= 0.9


def test_top_k_then_top_p_renormalises_over_the_top_k():
    logits = torch.tensor([4.0, 3.0, 2.0, 1.0, 0.0])
    kept, ids = candidates(logits, top_k=2, top_p=0.5)
    assert ids is not None
    assert ids.tolist() == [0]
    kept, ids = candidates(logits, top_k=3, top_p=1.0)
    assert ids is not None
    assert ids.tolist() == [0, 1, 2]
    torch.testing.assert_close(kept.sum(), torch.tensor(1.0))


def test_temperature_sampling_follows_the_softmax():
    logits = torch.tensor([2.0, 1.0, 0.0])
    params = SamplingParams(temperature=1.0, seed=42)
    counts = torch.bincount(torch.tensor([draw(logits, params, n) for n in range(3000)]))
    expected = logits.softmax(-1) * 3000
    assert torch.all((counts.float() - expected).abs() < 0.1 * 3000)


def test_suppressed_tokens_are_never_sampled():
    logits = torch.zeros(1, VOCAB)
    logits[0, 2] = 100.0  # the end token would win
    held_back = BatchItem(0, [1], 5, [[0]], True, SamplingParams(temperature=0.0), 1, (2, 7))
    assert sample(logits.clone(), [held_back]) != [2]
    assert sample(logits.clone(), [item(SamplingParams(temperature=0.0), 3)]) == [2]
    hot = BatchItem(0, [1], 5, [[0]], True, SamplingParams(temperature=1.0, seed=1), 1, (2,))
    assert all(sample(logits.clone(), [hot]) != [2] for _ in range(5))


# -- hostile values: each gives its row a token or an error, never the batch an exception ------

HOSTILE = [
    SamplingParams(temperature=1e-300),  # logits / T overflow: every probability NaN
    SamplingParams(temperature=5e-324),  # the smallest float there is
    SamplingParams(temperature=1e-38),
    SamplingParams(temperature=1e-300, top_k=5, top_p=0.5),
    SamplingParams(temperature=2.0, top_p=1e-300),
    SamplingParams(temperature=1.0, top_p=0.0),
    SamplingParams(temperature=1.0, top_k=2**70),
    SamplingParams(temperature=1.0, seed=-(2**63)),
    SamplingParams(temperature=1.0, seed=2**256),
]


@pytest.mark.parametrize("params", HOSTILE, ids=repr)
def test_a_hostile_sampling_value_gives_a_token_and_leaves_the_other_rows_alone(
    params: SamplingParams,
) -> None:
    logits = random_logits(rows=3)
    reference = sample(logits.clone(), [item(SamplingParams(temperature=0.0))] * 3)
    rows = [item(SamplingParams(temperature=0.0)), item(params), item(SamplingParams(seed=3))]
    tokens = sample(logits.clone(), rows)
    assert all(isinstance(token, int) and 0 <= token < VOCAB for token in tokens)
    assert tokens[0] == reference[0]


def test_a_temperature_below_the_greedy_threshold_is_the_argmax():
    logits = random_logits()
    for temperature in (1e-300, 1e-9, GREEDY_BELOW_TEMPERATURE / 2):
        assert SamplingParams(temperature=temperature).greedy
        rows = [item(SamplingParams(temperature=temperature))] * 4
        assert sample(logits.clone(), rows) == logits.argmax(-1).tolist()
    assert not SamplingParams(temperature=GREEDY_BELOW_TEMPERATURE).greedy


@pytest.mark.parametrize("temperature", [0.0, 0.8], ids=["greedy", "drawn"])
@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_a_row_with_non_finite_logits_fails_alone(temperature: float, bad: float) -> None:
    logits = random_logits(rows=3)
    logits[1, 7] = bad  # what a model that overflowed gives
    params = SamplingParams(temperature=temperature, seed=1)
    outcomes = sample(logits.clone(), [item(params)] * 3)
    assert isinstance(outcomes[1], Unsampleable)
    assert isinstance(outcomes[0], int) and isinstance(outcomes[2], int)


def test_a_row_whose_every_token_is_suppressed_fails_alone():
    logits = random_logits(rows=2)
    everything = tuple(range(VOCAB))
    rows = [BatchItem(0, [1], 5, [[0]], True, SamplingParams(temperature=0.0), 0, everything)]
    outcomes = sample(logits.clone(), [*rows, item(SamplingParams(temperature=0.0))])
    assert isinstance(outcomes[0], Unsampleable) and isinstance(outcomes[1], int)


def test_a_draw_that_raises_fails_its_row_alone():
    # A seed with more digits than Python will print raises while seeding the draw.
    unprintable = SamplingParams(temperature=1.0, seed=10**5000)
    outcomes = sample(random_logits(rows=2), [item(SamplingParams(seed=1)), item(unprintable)])
    assert isinstance(outcomes[0], int) and isinstance(outcomes[1], ValueError)


def test_suppressed_ids_past_the_vocabulary_are_ignored():
    logits = random_logits(rows=1)
    best = int(logits.argmax())
    row = BatchItem(0, [1], 5, [[0]], True, SamplingParams(temperature=0.0), 0, (VOCAB + 5, best))
    token = sample(logits.clone(), [row])[0]
    assert isinstance(token, int) and token != best


def test_a_repetition_penalty_lowers_the_tokens_already_in_the_context():
    """transformers' rule: a seen token's positive logit is divided by the penalty, a negative
    one multiplied; unseen tokens and other rows keep theirs."""
    logits = torch.zeros(2, VOCAB)
    logits[:, 3], logits[:, 4], logits[:, 5], logits[:, 6] = 2.0, 1.9, -1.0, -1.2
    penalized = SamplingParams(temperature=0.0, repetition_penalty=1.1)
    seen = BatchItem(0, [1], 5, [[0]], True, penalized, 0, context_token_ids=[3, 5, 3, VOCAB + 9])
    plain = item(SamplingParams(temperature=0.0))
    assert sample(logits, [seen, plain]) == [4, 3]  # 2.0 / 1.1 falls below 1.9
    assert logits[0, 3] == pytest.approx(2.0 / 1.1) and logits[0, 5] == pytest.approx(-1.1)
    assert logits[0, 6] == -1.2 and logits[1, 3] == 2.0
