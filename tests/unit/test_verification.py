"""Verifying drafts on torch logits: greedy rows accept exactly the argmax, sampled rows keep
their distribution (the speculative sampling rule), a repetition penalty and a grammar apply
at each draft position as plain decoding applies them there, and rows without a draft sample
as ever."""

from __future__ import annotations

import math

import pytest
import torch

from semantic.backends.torch.kernels import cpu_kernels, unavailable_reason
from semantic.backends.torch.runner import TorchRunner
from semantic.backends.torch.sampling import sample
from semantic.backends.torch.verification import sample_or_verify, verify
from semantic.core import Batch, BatchItem, SamplingParams
from semantic.models.served import ServedModel
from semantic.text.grammar import GrammarStates
from tests.unit.tiny_llama import tiny_llama

GREEDY = SamplingParams(temperature=0.0)


def item(
    draft: tuple[int, ...],
    sampling: SamplingParams = GREEDY,
    seq_id: int = 0,
    context: list[int] | None = None,
    num_output_tokens: int = 5,
) -> BatchItem:
    tokens = [1, *draft] if draft else [1]
    return BatchItem(
        seq_id,
        tokens,
        10,
        [[0]],
        True,
        sampling,
        num_output_tokens,
        context_token_ids=context or [],
        draft_token_ids=draft,
    )


def one_hot_rows(best: list[int], vocab: int = 8) -> torch.Tensor:
    logits = torch.zeros(len(best), vocab)
    for row, token in enumerate(best):
        logits[row, token] = 5.0
    return logits


def test_a_greedy_row_accepts_the_draft_up_to_its_first_miss_then_gives_the_argmax() -> None:
    logits = one_hot_rows([3, 4, 6, 2])
    assert verify(logits, item((3, 4, 5))) == [3, 4, 6]
    assert verify(logits, item((2, 4, 6))) == [3]


def test_a_greedy_row_that_accepts_the_whole_draft_gets_the_token_after_it() -> None:
    assert verify(one_hot_rows([3, 4, 6, 2]), item((3, 4, 6))) == [3, 4, 6, 2]


def test_a_row_with_no_finite_logit_where_it_is_read_fails_alone() -> None:
    logits = one_hot_rows([3, 4, 6])
    logits[1] = float("nan")
    assert isinstance(verify(logits, item((3, 5))), ValueError)
    assert verify(logits, item((2, 5))) == [3]  # the broken row comes after the miss


def test_items_with_and_without_drafts_get_their_own_rows() -> None:
    logits = one_hot_rows([7, 3, 4, 6, 5, 1, 2])
    items = [item(()), item((3, 4), seq_id=1), item(()), item((1,), seq_id=3)]
    assert sample_or_verify(logits, items) == [7, [3, 4, 6], 5, [1, 2]]


PENALIZED = SamplingParams(temperature=0.0, repetition_penalty=1.1)


def test_a_draft_token_accepted_counts_as_seen_at_the_positions_after_it() -> None:
    """Row 1 prefers 3 (5.0) to 4 (4.8) until the penalty lowers 3, drafted just before: so
    plain decoding gives 3 then 4, and the draft (3, 4) is accepted whole."""
    logits = one_hot_rows([3, 3, 6])
    logits[1, 4] = 4.8
    assert verify(logits.clone(), item((3, 4), PENALIZED, context=[1, 2])) == [3, 4, 6]
    assert verify(logits.clone(), item((3, 4), GREEDY, context=[1, 2])) == [3, 3]


def test_a_token_of_the_context_is_penalized_at_every_draft_position() -> None:
    """Token 3 is in the prompt: lowered from 5.0 to 4.55, below 5's 4.9, so the draft's 3 is
    rejected for 5; and a negative logit seen is multiplied (further from zero)."""
    logits = one_hot_rows([3, 2])
    logits[0, 5] = 4.9
    assert verify(logits.clone(), item((3,), PENALIZED, context=[3, 7])) == [5]
    negative = torch.full((2, 8), -2.0)
    negative[:, 6] = -1.0
    negative[:, 1] = -1.05
    assert verify(negative.clone(), item((6,), PENALIZED, context=[9])) == [6, 1]


def one_at_a_time(
    logits: torch.Tensor, drafted: BatchItem, grammars: GrammarStates | None
) -> list[int]:
    """What plain decoding gives from these rows, one token a step through `sample`: each step's
    context (for its penalty and grammar) the draft tokens before it, up to the first it
    does not give."""
    run: list[int] = []
    for row, token in enumerate((*drafted.draft_token_ids, None)):
        step = BatchItem(
            drafted.seq_id,
            [1],
            10 + row,
            [[0]],
            True,
            drafted.sampling,
            drafted.num_output_tokens + row,
            context_token_ids=[*drafted.context_token_ids, *drafted.draft_token_ids[:row]],
        )
        [given] = sample(logits[row : row + 1].clone(), [step], grammars)
        assert isinstance(given, int)
        run.append(given)
        if given != token:
            break
    return run


def drafts_of(truth: list[int], vocab: int) -> list[tuple[int, ...]]:
    """The whole of `truth` but its last token as a draft, and that draft wrong at each place."""
    whole = tuple(truth[:-1])
    wrong = [(*whole[:at], (whole[at] + 1) % vocab, *whole[at + 1 :]) for at in range(len(whole))]
    return [whole, *wrong]


def test_greedy_rows_under_a_penalty_accept_exactly_what_one_token_a_step_gives() -> None:
    """Eight tokens, so the context and the draft repeat them and the penalty often decides."""
    generator = torch.Generator().manual_seed(5)
    for trial in range(200):
        penalty = (1.1, 1.3)[trial % 2]
        sampling = SamplingParams(temperature=0.0, repetition_penalty=penalty)
        logits = torch.randn(6, 8, generator=generator) * 0.3 + 0.5 * (trial % 3 - 1)
        context = torch.randint(0, 8, (3,), generator=generator).tolist()
        truth = one_at_a_time(logits, item((9,) * 5, sampling, context=context), None)
        truth += [0] * (6 - len(truth))  # any tail: the drafts below are cut at its first miss
        for draft in drafts_of(truth, 8):
            drafted = item(draft, sampling, context=context)
            expected = one_at_a_time(logits, drafted, None)
            assert verify(logits.clone(), drafted) == expected, (trial, draft)


def test_rows_with_a_grammar_accept_exactly_what_one_token_a_step_gives(
    served: ServedModel,
) -> None:
    """A JSON schema's grammar, the unmasked argmax often a token it forbids: each draft
    position's mask is the grammar's state after the draft tokens before it, and its matcher
    takes the run's tokens (and only those), as one token a step would."""
    schema = {"type": "object", "properties": {"answer": {"enum": ["yes", "no"]}}}
    grammar = served.grammars.json_schema(schema)
    vocab = served.config.vocab_size
    generator = torch.Generator().manual_seed(9)
    for trial in range(12):
        penalty = (1.0, 1.3)[trial % 2]
        sampling = SamplingParams(temperature=0.0, repetition_penalty=penalty, grammar=grammar)
        logits = torch.randn(7, vocab, generator=generator)
        probe = item((0,) * 6, sampling, seq_id=trial, context=[5, 6], num_output_tokens=0)
        truth = one_at_a_time(logits, probe, GrammarStates(vocab))
        assert len(truth) == 1  # (the probe's draft of 0s is refused at once)
        truth = []
        states = GrammarStates(vocab)
        for row in range(7):  # the grammar's own path through these rows
            step = item((), sampling, seq_id=trial, context=[5, 6, *truth], num_output_tokens=row)
            [given] = sample(logits[row : row + 1].clone(), [step], states)
            assert isinstance(given, int)
            truth.append(given)
        for draft in drafts_of(truth, vocab):
            drafted = item(draft, sampling, seq_id=trial, context=[5, 6], num_output_tokens=0)
            expected = one_at_a_time(logits, drafted, GrammarStates(vocab))
            states = GrammarStates(vocab)
            [run] = sample_or_verify(logits.clone(), [drafted], states)
            assert run == expected, (trial, draft)
            # The matcher took the run and nothing after it: the next step finds it in place.
            _, errors = states.bitmask([(trial, grammar, len(expected))])
            assert not errors


def first_token_frequencies(
    logits: torch.Tensor,
    draft: int,
    sampling: SamplingParams,
    draws: int,
    context: list[int] | None = None,
) -> list[float]:
    counts = [0] * logits.shape[-1]
    rows = logits.expand(2, -1).clone()  # the draft's row, then the row after it
    for _ in range(draws):
        run = verify(rows.clone(), item((draft,), sampling, context=context))
        assert isinstance(run, list)
        counts[run[0]] += 1
    return [c / draws for c in counts]


def test_a_sampled_row_keeps_its_distribution_whichever_token_is_drafted() -> None:
    torch.manual_seed(0)
    probs = torch.tensor([0.5, 0.3, 0.15, 0.05])
    logits = probs.log()
    sampling = SamplingParams(temperature=1.0)
    for draft in (0, 1, 3):
        seen = first_token_frequencies(logits, draft, sampling, 6000)
        for p, f in zip(probs.tolist(), seen, strict=True):
            assert abs(p - f) < 4 * math.sqrt(p * (1 - p) / 6000) + 1e-3, (draft, seen)


def test_a_sampled_row_follows_temperature_and_top_k_and_never_accepts_a_token_they_drop() -> None:
    torch.manual_seed(1)
    logits = torch.tensor([2.0, 1.0, 0.5, -1.0])
    sampling = SamplingParams(temperature=0.7, top_k=2)
    kept = (logits[:2] / 0.7).softmax(-1).tolist()
    for draft in (1, 3):
        seen = first_token_frequencies(logits, draft, sampling, 4000)
        assert seen[2] == seen[3] == 0
        for p, f in zip(kept, seen[:2], strict=True):
            assert abs(p - f) < 4 * math.sqrt(p * (1 - p) / 4000) + 1e-3, (draft, seen)


def test_a_draft_that_top_p_keeps_alone_is_always_accepted() -> None:
    """Top-p keeps token 0 alone (61% of the mass before the cut): the draft's chance is its
    share of what top-p keeps, 1, not 0.61; rejected with no other candidate left, the
    draw had nothing to draw from (a sampled agent's request failed on it)."""
    torch.manual_seed(3)
    logits = torch.tensor([2.0, 1.0, 0.5, -1.0])
    sampling = SamplingParams(temperature=1.0, top_p=0.5)
    for draft in (0, 1):
        assert first_token_frequencies(logits, draft, sampling, 300) == [1.0, 0.0, 0.0, 0.0]


def test_a_sampled_row_under_a_penalty_keeps_the_penalized_distribution() -> None:
    torch.manual_seed(2)
    logits = torch.tensor([1.0, 0.8, -0.5, 0.2])
    sampling = SamplingParams(temperature=1.0, repetition_penalty=1.3)
    penalized = torch.tensor([1.0 / 1.3, 0.8, -0.5 * 1.3, 0.2]).softmax(-1).tolist()
    for draft in (0, 1):
        seen = first_token_frequencies(logits, draft, sampling, 4000, context=[0, 2])
        for p, f in zip(penalized, seen, strict=True):
            assert abs(p - f) < 4 * math.sqrt(p * (1 - p) / 4000) + 1e-3, (draft, seen)


def test_a_sampled_row_with_a_grammar_gives_only_tokens_it_allows_and_keeps_its_matcher(
    served: ServedModel,
) -> None:
    grammar = served.grammars.json_schema({"type": "object"})
    vocab = served.config.vocab_size
    sampling = SamplingParams(temperature=1.0, seed=11, grammar=grammar)
    draft = (*served.tokenizer.encode("{"), 5, 6)  # its start allowed, then likely not
    for trial in range(20):
        rows = 1 + len(draft)
        logits = torch.randn(rows, vocab, generator=torch.Generator().manual_seed(trial))
        states = GrammarStates(vocab)
        run = verify(logits, item(draft, sampling, num_output_tokens=0), states)
        assert isinstance(run, list), run
        replay = GrammarStates(vocab)  # a fresh matcher takes the run: the grammar allows it
        _, errors = replay.bitmask([(0, grammar, 0)])
        assert not errors
        assert all(replay.accept(0, token) is None for token in run)
        _, errors = states.bitmask([(0, grammar, len(run))])  # the verifier's kept step
        assert not errors


def test_a_seeded_sampled_row_verifies_the_same_way_every_time() -> None:
    logits = torch.randn(4, 50)
    sampling = SamplingParams(temperature=1.0, seed=7)
    runs = {tuple(verify(logits, item((3, 9, 4), sampling))) for _ in range(5)}  # type: ignore[arg-type]
    assert len(runs) == 1


def tiny_runner() -> TorchRunner:
    config, weights = tiny_llama(tied=True, vocab_size=300)
    return TorchRunner(
        config, weights, block_tokens=4, cache_budget_mb=4, dtype="float32", kernels=False
    )


def greedy_decodes(runner: TorchRunner, seq_id: int, prompt: list[int], steps: int) -> list[int]:
    """`steps` greedy tokens decoded one a step, in the pages of `seq_id`."""
    table = list(range(seq_id * 16, (seq_id + 1) * 16))
    [token] = runner.run(Batch([BatchItem(seq_id, prompt, 0, [table], True, GREEDY, 0)]))
    assert isinstance(token, int)
    tokens = [token]
    while len(tokens) < steps:
        position = len(prompt) + len(tokens) - 1
        item = BatchItem(seq_id, [tokens[-1]], position, [table], True, GREEDY, len(tokens))
        [token] = runner.run(Batch([item]))
        assert isinstance(token, int)
        tokens.append(token)
    return tokens


def test_the_torch_runner_verifies_a_draft_beside_a_plain_decode_as_decoding_one_by_one() -> None:
    runner = tiny_runner()
    prompts = [[5, 9, 14, 2, 7, 7], [11, 3, 40]]
    truth = [greedy_decodes(runner, i, p, 8) for i, p in enumerate(prompts)]
    # Fresh pages: the first prompt again, then its first token with a draft of the next five,
    # the fourth of them wrong; the second sequence decodes its next token beside it.
    table = list(range(2 * 16, 3 * 16))
    runner.run(Batch([BatchItem(2, prompts[0], 0, [table], True, GREEDY, 0)]))
    draft = (*truth[0][1:4], (truth[0][4] + 1) % 300, truth[0][5])
    drafted = BatchItem(
        2, [truth[0][0], *draft], len(prompts[0]), [table], True, GREEDY, 1, draft_token_ids=draft
    )
    other_table = list(range(16, 32))
    position = len(prompts[1]) + 6
    plain = BatchItem(1, [truth[1][6]], position, [other_table], True, GREEDY, 7)
    assert runner.run(Batch([drafted, plain])) == [truth[0][1:5], truth[1][7]]
    # Accepted whole: the token after the draft too, read through the K/V the draft wrote.
    whole = tuple(truth[0][1:6])
    drafted = BatchItem(
        2, [truth[0][0], *whole], len(prompts[0]), [table], True, GREEDY, 1, draft_token_ids=whole
    )
    assert runner.run(Batch([drafted])) == [truth[0][1:7]]


def decode_logits(runner: TorchRunner, prompt: list[int], tokens: list[int]) -> torch.Tensor:
    """The logits decoding `tokens` after `prompt` gives, one token a step ([len(tokens), V])."""
    table = list(range(16))
    runner.run(Batch([BatchItem(0, prompt, 0, [table], True, GREEDY, 0)]))
    rows = []
    for n, token in enumerate(tokens):
        item = BatchItem(0, [token], len(prompt) + n, [table], True, GREEDY, n + 1)
        rows.append(runner.forward_logits(Batch([item])))
    return torch.cat(rows)


@pytest.mark.skipif(cpu_kernels() is None, reason=f"no CPU kernels: {unavailable_reason()}")
def test_a_draft_is_verified_with_the_very_logits_decoding_one_token_a_step_gives() -> None:
    # bf16 on our kernels with an 8-bit pool, as a CPU server runs: a draft's logits must be
    # bit for bit a plain decode's, or a near tie can flip a greedy token.
    config, weights = tiny_llama(tied=True, vocab_size=300)
    runner = TorchRunner(config, weights, block_tokens=4, cache_budget_mb=4, dtype="bfloat16")
    assert runner.cache_spec.kv_dtype == "int8"
    prompt = [(7 * i + 3) % 300 for i in range(37)]
    tokens = [5, 81, 17, 240, 9, 33]
    plain = decode_logits(runner, prompt, tokens)
    for seq, drafted in enumerate((2, 5), start=1):  # odd and even row counts
        table = list(range(16 * seq, 16 * seq + 16))
        runner.run(Batch([BatchItem(seq, prompt, 0, [table], True, GREEDY, 0)]))
        draft = tuple(tokens[1 : 1 + drafted])
        item = BatchItem(
            seq, [tokens[0], *draft], len(prompt), [table], True, GREEDY, 1, draft_token_ids=draft
        )
        assert torch.equal(runner.forward_logits(Batch([item])), plain[: 1 + drafted])
