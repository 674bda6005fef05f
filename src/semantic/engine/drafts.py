"""Drafts for speculative decoding, from a sequence's own context (prompt lookup): the tokens
that followed the most recent earlier occurrence of its last few tokens.

Pure: token ids in, token ids out. Coding agents copy long spans of their context (an edited
file repeats most of the file), so such a draft is often what the model would say next; the
runner verifies it in one forward pass (`BatchItem.draft_token_ids`).
"""

from __future__ import annotations

from collections.abc import Sequence

# The longest and shortest tail matched, the longest tried first: a longer match is likelier to
# continue the same way. Shorter tails recur everywhere in prose (a newline, " the"), so their
# drafts are mostly rejected: with 2-token tails a chat answer verified 4x the draft tokens for
# about the same accepted, and ran slower than without drafts (docs/benchmark-history.md).
LONGEST_MATCH = 3
SHORTEST_MATCH = 3
# How far back a search looks: bounds its cost per step on a long context (a Python loop, about
# a tenth of a millisecond per thousand tokens).
SEARCH_TOKENS = 8192


def next_limit(limit: int, drafted: int, accepted: int, longest: int) -> int:
    """The longest draft a sequence may have next (`limit` now), after one of `drafted` tokens
    was verified with `accepted` of them taken: twice as long after a draft taken whole (up to
    `longest`), one past the run it got right after a miss. A verification costs a row for
    every draft token whether or not it is taken (on two CPU cores, nine rows cost several
    steps at a few thousand tokens of context: each row attends alone), so a sequence whose
    drafts miss soon drafts a token or two and loses little, and one copying a file is back at
    the longest within a few steps."""
    if accepted == drafted:
        return min(longest, 2 * limit)
    return accepted + 1


def propose(token_ids: Sequence[int], max_tokens: int) -> list[int]:
    """Up to `max_tokens` tokens that followed the most recent earlier occurrence of the last
    `LONGEST_MATCH` tokens of `token_ids` (failing that, of fewer, down to `SHORTEST_MATCH`);
    empty when none recurs."""
    return propose_matching(token_ids, max_tokens, LONGEST_MATCH, SHORTEST_MATCH)


def propose_matching(
    token_ids: Sequence[int], max_tokens: int, longest: int, shortest: int
) -> list[int]:
    """`propose`, matching tails of `longest` down to `shortest` tokens."""
    if max_tokens <= 0:
        return []
    for length in range(longest, shortest - 1, -1):
        start = _last_occurrence(token_ids, length)
        if start is not None:
            follows = start + length
            return list(token_ids[follows : follows + max_tokens])
    return []


def _last_occurrence(token_ids: Sequence[int], length: int) -> int | None:
    """Where the last `length` tokens occurred before, latest first (never the tail itself)."""
    end = len(token_ids)
    if end <= length:
        return None
    tail = list(token_ids[end - length :])
    last = tail[-1]
    # A match ends at `stop`, one before the tail ends at the latest, so a token follows it.
    for stop in range(end - 2, max(length - 2, end - 2 - SEARCH_TOKENS), -1):
        if token_ids[stop] == last and list(token_ids[stop - length + 1 : stop + 1]) == tail:
            return stop - length + 1
    return None
