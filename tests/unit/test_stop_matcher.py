"""StopMatcher: text before a stop string comes out, the stop and what follows never do."""

from __future__ import annotations

import random

import pytest

from semantic.text.detokenizer import StopMatcher


def run(stops: tuple[str, ...], deltas: list[str]) -> tuple[str, str | None]:
    matcher = StopMatcher(stops)
    emitted = []
    for delta in deltas:
        text, stop = matcher.feed(delta)
        emitted.append(text)
        if stop is not None:
            return "".join(emitted), stop
    return "".join(emitted) + matcher.flush(), None


def test_text_without_stops_passes_through_unchanged() -> None:
    matcher = StopMatcher(())
    assert matcher.feed("hello ") == ("hello ", None)
    assert matcher.feed("world") == ("world", None)
    assert matcher.flush() == ""


def test_stop_inside_one_delta_cuts_before_it() -> None:
    assert run(("STOP",), ["abc STOP def"]) == ("abc ", "STOP")


def test_stop_split_across_deltas_is_held_back_then_cut() -> None:
    matcher = StopMatcher(("</end>",))
    assert matcher.feed("text </") == ("text ", None)
    assert matcher.feed("en") == ("", None)
    assert matcher.feed("d> tail") == ("", "</end>")


def test_held_prefix_is_released_when_it_stops_matching() -> None:
    matcher = StopMatcher(("</end>",))
    assert matcher.feed("a </e") == ("a ", None)
    assert matcher.feed("x") == ("</ex", None)


def test_held_text_comes_out_of_flush_at_the_end() -> None:
    matcher = StopMatcher(("###",))
    assert matcher.feed("answer ##") == ("answer ", None)
    assert matcher.flush() == "##"


def test_nothing_is_emitted_after_a_stop() -> None:
    matcher = StopMatcher(("x",))
    assert matcher.feed("axb") == ("a", "x")
    assert matcher.feed("more") == ("", None)
    assert matcher.flush() == ""


@pytest.mark.parametrize("chunk", [1, 2, 3, 100])
def test_the_first_stop_to_complete_wins_however_text_is_split(chunk: int) -> None:
    text = "xx abcd yy"
    deltas = [text[i : i + chunk] for i in range(0, len(text), chunk)]
    assert run(("abcd", "bc"), deltas) == ("xx a", "bc")


def test_overlapping_stops_at_the_same_end_cut_at_the_earlier_start() -> None:
    assert run(("c", "bc"), ["abc"]) == ("a", "bc")


def test_stop_at_the_very_start_emits_nothing() -> None:
    assert run(("\n\n",), ["\n", "\nrest"]) == ("", "\n\n")


def test_empty_stop_strings_are_ignored() -> None:
    assert run(("",), ["abc"]) == ("abc", None)


@pytest.mark.parametrize("chunk", [1, 2, 5])
def test_emitted_text_is_a_prefix_of_the_input_in_any_chunking(chunk: int) -> None:
    text = "one <stop-ish> two <sto three <stop> four"
    deltas = [text[i : i + chunk] for i in range(0, len(text), chunk)]
    assert run(("<stop>",), deltas) == ("one <stop-ish> two <sto three ", "<stop>")


def first_stop(text: str, stops: tuple[str, ...]) -> tuple[str, str | None]:
    """What a matcher must answer, found the slow way: the stop whose match ends first (on a
    tie, the longer one), and the text before it; all of the text when none occurs."""
    found = [
        (start + len(stop), -len(stop), stop)
        for stop in stops
        if stop and (start := text.find(stop)) >= 0
    ]
    if not found:
        return text, None
    end, minus_length, stop = min(found)
    return text[: end + minus_length], stop


def test_many_overlapping_stops_agree_with_a_plain_search_in_any_chunking() -> None:
    """Stops that are prefixes, suffixes and infixes of one another over a two-letter alphabet,
    where a matcher must fall back from a failed partial match to the longest one still alive."""
    rng = random.Random(7)
    for _ in range(2000):
        stops = tuple("".join(rng.choices("ab", k=rng.randint(1, 6))) for _ in range(3))
        text = "".join(rng.choices("ab", k=rng.randint(0, 30)))
        cuts = sorted(rng.sample(range(1, len(text)), k=min(3, max(0, len(text) - 1))))
        deltas = [text[i:j] for i, j in zip([0, *cuts], [*cuts, len(text)], strict=True)]
        assert run(stops, deltas) == first_stop(text, stops), (stops, deltas)


def test_text_is_held_back_only_while_it_may_begin_a_stop() -> None:
    matcher = StopMatcher(("aab", "abc"))
    assert matcher.feed("xaa") == ("x", None)  # "aa" may begin "aab"
    assert matcher.feed("a") == ("a", None)  # "aaa": only the last two still may
    assert matcher.feed("bd") == ("", "aab")
