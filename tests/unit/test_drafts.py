"""Drafts from a sequence's own context (prompt lookup): what follows the last earlier
occurrence of its last tokens."""

from __future__ import annotations

from semantic.engine.drafts import LONGEST_MATCH, SEARCH_TOKENS, propose, propose_matching


def test_the_tokens_after_the_last_earlier_occurrence_of_the_tail_are_the_draft() -> None:
    context = [1, 2, 3, 4, 5, 6, 9, 1, 2, 3, 4, 7, 8, 2, 3, 4]
    # The tail 2 3 4 occurred twice before: the latest (followed by 7 8) wins.
    assert propose(context, 2) == [7, 8]
    assert propose(context, 10) == [7, 8, 2, 3, 4]


def test_a_longer_match_is_tried_before_a_shorter_one() -> None:
    # 5 6 last recurred before 8, but the whole tail 4 5 6 only at the start, before 7.
    context = [4, 5, 6, 7, 7, 9, 5, 6, 8, 4, 5, 6]
    assert propose_matching(context, 1, 3, 2) == [7]
    assert LONGEST_MATCH == 3


def test_a_shorter_tail_is_matched_when_the_longer_does_not_recur() -> None:
    context = [9, 5, 6, 7, 1, 5, 6]
    assert propose_matching(context, 3, 3, 2) == [7, 1, 5]
    assert propose(context, 3) == []  # two tokens are too short a match by default


def test_no_draft_when_the_tail_never_recurs_or_none_is_wanted() -> None:
    assert propose([1, 2, 3, 4, 5], 4) == []
    assert propose([1, 2, 3, 1, 2, 3], 0) == []
    assert propose([], 4) == []
    assert propose([7], 4) == []
    # A single token recurring is not a match: 3 occurs before, 2 3 does not.
    assert propose_matching([3, 1, 2, 3], 4, 3, 1) == [1, 2, 3]
    assert propose_matching([3, 1, 2, 3], 4, 3, 2) == []


def test_a_repeated_token_drafts_its_own_repetition() -> None:
    assert propose([0, 5, 5, 5, 5], 3) == [5]
    assert propose([7, 8, 7, 8, 7, 8], 4) == [7, 8]


def test_the_search_looks_back_a_bounded_number_of_tokens() -> None:
    old = [1, 2, 3, 42]
    filler = [10 + i % 50_000 for i in range(SEARCH_TOKENS + 10)]
    assert propose(old + filler + [1, 2, 3], 1) == []
    assert propose(old + filler[:100] + [1, 2, 3], 1) == [42]
