"""The MLX backend's sampler (numpy, no torch) keeps the torch sampler's rules: the same greedy
token (suppressed ids and grammars included), draws only from the torch sampler's top-k / top-p
candidates, a seeded draw that depends on nothing but its seed and position, and a broken row
that fails alone. The torch sampler is the reference."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
import torch

from semantic.backends.mlx import sampling as mlx
from semantic.backends.sampling import Unsampleable
from semantic.backends.torch import sampling as reference
from semantic.core import BatchItem, SamplingParams, TokenLogprob
from semantic.models.served import ServedModel
from semantic.text.grammar import Grammar, GrammarStates, allowed
from tests.unit.test_sampling import HOSTILE

VOCAB = 50
GREEDY = SamplingParams(temperature=0.0)


def item(
    params: SamplingParams, generated: int = 0, suppress: tuple[int, ...] = (), seq_id: int = 0
) -> BatchItem:
    return BatchItem(seq_id, [1], 5, [[0]], True, params, generated, suppress)


def random_logits(rows: int = 4, vocab: int = VOCAB, seed: int = 0) -> np.ndarray:
    return (np.random.default_rng(seed).standard_normal((rows, vocab)) * 3).astype(np.float32)


Outcomes = list[int | TokenLogprob | Exception]


def both(
    logits: np.ndarray, items: list[BatchItem], grammars: tuple[GrammarStates, GrammarStates]
) -> tuple[Outcomes, Outcomes]:
    """The numpy sampler's outcomes and the torch sampler's, each on its own copy."""
    ours = mlx.sample(logits.copy(), items, grammars[0])
    theirs = reference.sample(torch.from_numpy(logits.copy()), items, grammars[1])
    return ours, theirs


def same_outcomes(ours: Outcomes, theirs: Outcomes) -> bool:
    return [o if isinstance(o, int) else type(o) for o in ours] == [
        t if isinstance(t, int) else type(t) for t in theirs
    ]


def test_the_sampler_imports_no_torch() -> None:
    code = "import sys, semantic.backends.mlx.sampling; sys.exit('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], check=False).returncode == 0


def test_greedy_rows_match_the_torch_sampler_suppressed_ids_included() -> None:
    logits = random_logits(rows=5)
    best = logits.argmax(-1)
    rows = [
        item(GREEDY),
        item(GREEDY, suppress=(int(best[1]),)),  # its best token held back: the runner-up
        item(GREEDY, suppress=(VOCAB + 3, -1)),  # ids past the vocabulary are ignored
        item(SamplingParams(temperature=1.5, top_k=1), suppress=(int(best[3]), 0)),
        item(SamplingParams(temperature=GREEDY.temperature + 1e-9)),
    ]
    ours, theirs = both(logits, rows, (GrammarStates(VOCAB), GrammarStates(VOCAB)))
    assert ours == theirs
    assert ours[1] != best[1] and ours[3] != best[3] and ours[0] == best[0]


def test_greedy_is_the_argmax_of_every_row_of_a_large_batch() -> None:
    logits = random_logits(rows=64, vocab=1000, seed=3)
    assert mlx.sample(logits.copy(), [item(GREEDY)] * 64) == logits.argmax(-1).tolist()


@pytest.mark.parametrize(
    ("top_k", "top_p"), [(5, 1.0), (0, 0.6), (8, 0.7), (0, 0.95)], ids=["k", "p", "k+p", "wide-p"]
)
def test_draws_come_only_from_the_torch_candidates(top_k: int, top_p: float) -> None:
    """Every candidate the torch sampler keeps is drawn at some seed, and nothing else is."""
    logits = random_logits(rows=1, seed=5)[0] / 2  # flat enough for a wide nucleus
    params = SamplingParams(temperature=0.9, top_k=top_k, top_p=top_p, seed=11)
    _, ids = reference.candidates(torch.from_numpy(logits) / 0.9, top_k, top_p)
    assert ids is not None and 1 < len(ids) < VOCAB
    drawn = {mlx.draw(logits.copy(), params, n) for n in range(600)}
    assert drawn == set(ids.tolist())


@pytest.mark.parametrize(("top_k", "top_p"), [(5, 1.0), (0, 0.6), (8, 0.7), (0, 1.0), (3, 0.0)])
def test_candidates_and_their_probabilities_match_torch(top_k: int, top_p: float) -> None:
    logits = random_logits(rows=1, seed=6)[0]
    probs, ids = mlx.candidates(logits, top_k, top_p)
    want_probs, want_ids = reference.candidates(torch.from_numpy(logits), top_k, top_p)
    assert (ids is None) == (want_ids is None)
    if ids is not None and want_ids is not None:
        assert ids.tolist() == want_ids.tolist()
    np.testing.assert_allclose(probs, want_probs.numpy(), rtol=1e-5, atol=1e-7)


def test_top_p_stops_at_the_token_whose_mass_before_it_reaches_top_p() -> None:
    flat = np.zeros(4, np.float32)  # exactly a quarter each: the second token ends at 0.5
    _, ids = mlx.candidates(flat, top_k=0, top_p=0.5)
    want, _ = reference.candidates(torch.from_numpy(flat), top_k=0, top_p=0.5)
    assert ids is not None and len(ids) == len(want) == 2


def test_top_p_wider_than_the_candidate_window_sorts_the_whole_vocabulary() -> None:
    probs, ids = mlx.candidates(np.zeros(4096, np.float32), top_k=0, top_p=0.9)
    assert ids is not None and len(ids) == len(probs) == 3687  # as the torch sampler keeps
    assert float(probs.sum()) >= 0.9


def test_temperature_sampling_follows_the_softmax() -> None:
    logits = np.array([2.0, 1.0, 0.0], np.float32)
    params = SamplingParams(temperature=1.0, seed=42)
    counts = np.bincount([mlx.draw(logits, params, n) for n in range(3000)], minlength=3)
    expected = np.exp(logits) / np.exp(logits).sum() * 3000
    assert np.all(np.abs(counts - expected) < 0.1 * 3000)


def test_a_seeded_row_draws_the_same_token_whatever_it_is_batched_with() -> None:
    logits = random_logits(rows=4)
    seeded = [item(SamplingParams(temperature=1.0, seed=7), generated=n) for n in range(30)]
    alone = [mlx.sample(logits[1:2].copy(), [row])[0] for row in seeded]
    batched = []
    for row in seeded:
        others = [item(SamplingParams(temperature=1.0)), row, item(GREEDY)]
        batched.append(mlx.sample(logits[:3].copy(), others)[1])
    assert alone == batched
    assert len(set(alone)) > 1  # each position draws afresh, not one repeated token


def test_different_seeds_give_different_streams() -> None:
    logits = np.zeros(VOCAB, np.float32)
    first = [mlx.draw(logits, SamplingParams(seed=1), n) for n in range(10)]
    second = [mlx.draw(logits, SamplingParams(seed=2), n) for n in range(10)]
    assert first != second


@pytest.mark.parametrize("temperature", [0.0, 0.8], ids=["greedy", "drawn"])
@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
def test_a_row_with_non_finite_logits_fails_alone(temperature: float, bad: float) -> None:
    logits = random_logits(rows=3)
    logits[1, 7] = bad
    if bad == float("-inf"):
        logits[1] = bad  # -inf is a masked token; only a row with nothing else is broken
    outcomes = mlx.sample(logits, [item(SamplingParams(temperature=temperature, seed=1))] * 3)
    assert isinstance(outcomes[1], Unsampleable)
    assert isinstance(outcomes[0], int) and isinstance(outcomes[2], int)


@pytest.mark.parametrize("temperature", [float("nan"), float("inf")])
def test_a_row_with_a_temperature_that_breaks_its_probabilities_fails_alone(
    temperature: float,
) -> None:
    logits = random_logits(rows=3)
    broken = item(SamplingParams(temperature=temperature), suppress=(4,))  # inf: -inf/inf, NaN
    rows = [item(GREEDY), broken, item(SamplingParams(seed=3))]
    ours, theirs = both(logits, rows, (GrammarStates(VOCAB), GrammarStates(VOCAB)))
    assert isinstance(ours[1], Unsampleable) and isinstance(theirs[1], Unsampleable)
    assert ours[0] == theirs[0] and isinstance(ours[2], int)


@pytest.mark.parametrize("params", HOSTILE, ids=repr)
def test_a_hostile_sampling_value_gives_a_token_and_leaves_the_other_rows_alone(
    params: SamplingParams,
) -> None:
    logits = random_logits(rows=3)
    rows = [item(GREEDY), item(params), item(SamplingParams(seed=3))]
    tokens = mlx.sample(logits.copy(), rows)
    assert all(isinstance(token, int) and 0 <= token < VOCAB for token in tokens)
    assert tokens[0] == int(logits[0].argmax())


def test_a_draw_that_raises_fails_its_row_alone() -> None:
    unprintable = SamplingParams(temperature=1.0, seed=10**5000)  # raises while seeding
    outcomes = mlx.sample(random_logits(rows=2), [item(SamplingParams(seed=1)), item(unprintable)])
    assert isinstance(outcomes[0], int) and isinstance(outcomes[1], ValueError)


def test_a_row_whose_every_token_is_suppressed_fails_alone() -> None:
    rows = [item(GREEDY, suppress=tuple(range(VOCAB))), item(GREEDY)]
    outcomes = mlx.sample(random_logits(rows=2), rows)
    assert isinstance(outcomes[0], Unsampleable) and isinstance(outcomes[1], int)


# -- grammars ----------------------------------------------------------------------------------


@pytest.fixture
def boolean(served: ServedModel) -> Grammar:
    return served.grammars.json_schema({"type": "boolean"})


def test_constrained_greedy_rows_match_the_torch_sampler_step_by_step(
    served: ServedModel, boolean: Grammar
) -> None:
    """Each step the model prefers a token the grammar forbids; both samplers pick the same
    allowed one, and each matcher takes it."""
    vocab = served.config.vocab_size
    states = (GrammarStates(vocab), GrammarStates(vocab))
    checker = GrammarStates(vocab)
    for step in range(3):
        logits = random_logits(rows=2, vocab=vocab, seed=step)
        constrained = SamplingParams(temperature=0.0, grammar=boolean)
        rows = [item(GREEDY, step, seq_id=1), item(constrained, step, seq_id=2)]
        mask, _ = checker.bitmask([(2, boolean, step)])
        assert not allowed(mask[0], vocab)[logits[1].argmax()]  # the mask has work to do
        ours, theirs = both(logits, rows, states)
        assert ours == theirs and ours[0] == int(logits[0].argmax())
        token = ours[1]
        assert isinstance(token, int) and allowed(mask[0], vocab)[token]
        assert checker.accept(2, token) is None


def test_a_constrained_draw_takes_an_allowed_token_and_advances_its_matcher(
    served: ServedModel, boolean: Grammar
) -> None:
    vocab = served.config.vocab_size
    grammars = GrammarStates(vocab)
    first, _ = GrammarStates(vocab).bitmask([(9, boolean, 0)])
    for seed in range(20):
        row = item(SamplingParams(temperature=1.0, seed=seed, grammar=boolean), seq_id=seed)
        token = mlx.sample(random_logits(rows=1, vocab=vocab), [row], grammars)[0]
        assert isinstance(token, int) and allowed(first[0], vocab)[token]
        # Its matcher took the token: one generated token is what it expects next step.
        assert grammars.bitmask([(seed, boolean, 1)])[1] == {}


def test_a_grammar_with_no_allowed_token_left_fails_its_row_alone(
    served: ServedModel, boolean: Grammar
) -> None:
    """After "true" the grammar allows only the end token; suppressing it leaves nothing."""
    tokenizer = served.tokenizer
    vocab = served.config.vocab_size
    states = (GrammarStates(vocab), GrammarStates(vocab))
    done = tokenizer.encode("true")
    for grammars in states:
        for count, token in enumerate(done):
            grammars.bitmask([(2, boolean, count)])
            assert grammars.accept(2, token) is None
    end = tuple(sorted(tokenizer.eos_token_ids)) or (0,)
    stuck = item(SamplingParams(temperature=0.0, grammar=boolean), len(done), end, seq_id=2)
    rows = [item(GREEDY), item(SamplingParams(temperature=0.0, grammar=boolean), seq_id=1), stuck]
    ours, theirs = both(random_logits(rows=3, vocab=vocab), rows, states)
    assert same_outcomes(ours, theirs)
    assert isinstance(ours[0], int) and isinstance(ours[1], int)
    assert isinstance(ours[2], Unsampleable)


def test_a_repetition_penalty_gives_the_torch_samplers_tokens() -> None:
    logits = random_logits(rows=3)
    penalized = SamplingParams(temperature=0.0, repetition_penalty=1.3)
    context = [int(i) for i in logits.argmax(-1)]  # each row's best is penalized
    items = [
        BatchItem(r, [1], 5, [[0]], True, penalized, 0, context_token_ids=context) for r in range(3)
    ]
    ours = mlx.sample(logits.copy(), items)
    assert ours == reference.sample(torch.from_numpy(logits.copy()), items)
    assert ours != logits.argmax(-1).tolist()
