"""Output tokens → text deltas as they are generated, and stop strings cut out of that text.

Both hold text back rather than emit something they would have to take back: a half-decoded UTF-8
character, or the first characters of what may become a stop string.
"""

from __future__ import annotations

import collections

from semantic.text.tokenizer import Tokenizer

_INCOMPLETE = "\ufffd"  # what a decoder produces for a UTF-8 sequence that is not finished yet


class IncrementalDetokenizer:
    """Decodes one token at a time (the prefix/read-offset technique of vLLM and TGI).

    Each push decodes only a short window: `ids[prefix_offset:read_offset]` is text already
    emitted, kept as left context because decoders treat a window's first token specially (e.g.
    a leading space); `ids[read_offset:]` is what is new. Invariant: the pushes' deltas plus
    `flush()` concatenate to `tokenizer.decode(all ids)`.
    """

    def __init__(self, tokenizer: Tokenizer, *, skip_special_tokens: bool = True) -> None:
        self._tokenizer = tokenizer
        self._skip_special = skip_special_tokens
        self._ids: list[int] = []
        self._prefix_offset = 0
        self._read_offset = 0

    @property
    def token_ids(self) -> list[int]:
        return list(self._ids)

    def push(self, token_id: int) -> str:
        """The new text this token completes; "" while it ends in an unfinished character."""
        self._ids.append(token_id)
        prefix_text = self._decode(self._ids[self._prefix_offset : self._read_offset])
        new_text = self._decode(self._ids[self._prefix_offset :])
        if len(new_text) <= len(prefix_text) or new_text.endswith(_INCOMPLETE):
            return ""
        self._prefix_offset, self._read_offset = self._read_offset, len(self._ids)
        return new_text[len(prefix_text) :]

    def flush(self) -> str:
        """Whatever is still held back at the end of generation, replacement characters and all."""
        prefix_text = self._decode(self._ids[self._prefix_offset : self._read_offset])
        new_text = self._decode(self._ids[self._prefix_offset :])
        self._prefix_offset, self._read_offset = self._read_offset, len(self._ids)
        return new_text[len(prefix_text) :]

    def _decode(self, ids: list[int]) -> str:
        return self._tokenizer.decode(ids, skip_special_tokens=self._skip_special)


class StopMatcher:
    """Cuts generated text at the first stop string.

    Emits text only once no stop string can begin inside it: the longest tail of the text that
    is a proper prefix of some stop string is held back until the next delta decides it. The stop
    string itself and everything after it are never emitted. The first stop to complete wins (on
    a tie, the longer one), so the outcome does not depend on how the text was split into deltas.

    The stops are one Aho–Corasick automaton (`_StopAutomaton`): each character moves it one
    step, and its state is that held tail. So a delta costs its own length, whatever the
    number and length of the stops, where searching the text for each stop again at every
    delta cost their total length squared on the engine thread.
    """

    def __init__(self, stops: tuple[str, ...]) -> None:
        self.stops = tuple(stop for stop in stops if stop)
        self._automaton = _StopAutomaton(self.stops)
        self._state = 0
        # The held-back characters, one an item: releasing some from the front costs their
        # number, where slicing a string would copy all that stays held.
        self._held: collections.deque[str] = collections.deque()
        self.matched: str | None = None

    def feed(self, delta: str) -> tuple[str, str | None]:
        """(text safe to emit now, the stop string matched by this delta or None)."""
        if self.matched is not None:
            return "", None  # generation is over; later text is discarded
        if not self.stops:
            return delta, None  # nothing to hold back: no per-character walk for every token
        for char in delta:
            self._held.append(char)
            self._state = self._automaton.step(self._state, char)
            stop = self._automaton.stop_at(self._state)
            if stop is not None:
                self.matched = stop
                text = self._release(len(self._held) - len(stop))
                self._held.clear()
                return text, stop
        return self._release(len(self._held) - self._automaton.depth[self._state]), None

    def flush(self) -> str:
        """The held-back text, when generation ends without a stop string."""
        return self._release(len(self._held))

    def _release(self, count: int) -> str:
        return "".join(self._held.popleft() for _ in range(count))


class _StopAutomaton:
    """An Aho–Corasick automaton over stop strings: state 0 is the empty text, every other
    state the prefix of some stop that the text read so far ends with, the longest such
    (`depth` is its length). Built in time linear in the stops' total length; a step costs
    amortized constant time."""

    def __init__(self, stops: tuple[str, ...]) -> None:
        self.depth = [0]
        self._edges: list[dict[str, int]] = [{}]
        self._fallback = [0]  # the state of the longest proper suffix that is a state too
        self._ends: list[str | None] = [None]  # the longest stop that ends in this state
        for stop in stops:
            self._add(stop)
        self._link()

    def step(self, state: int, char: str) -> int:
        while state and char not in self._edges[state]:
            state = self._fallback[state]
        return self._edges[state].get(char, 0)

    def stop_at(self, state: int) -> str | None:
        """The longest stop string that the text read ends with in `state`, if any."""
        return self._ends[state]

    def _add(self, stop: str) -> None:
        state = 0
        for char in stop:
            if char not in self._edges[state]:
                self._edges.append({})
                self._fallback.append(0)
                self._ends.append(None)
                self.depth.append(self.depth[state] + 1)
                self._edges[state][char] = len(self._edges) - 1
            state = self._edges[state][char]
        self._ends[state] = stop

    def _link(self) -> None:
        """Fallbacks breadth first (a state's comes from its parent's), and each state's stop:
        its own, else its fallback's (the longest stop it ends with)."""
        queue = collections.deque(self._edges[0].values())
        while queue:
            state = queue.popleft()
            for char, child in self._edges[state].items():
                fallback = self.step(self._fallback[state], char)
                self._fallback[child] = fallback
                self._ends[child] = self._ends[child] or self._ends[fallback]
                queue.append(child)
