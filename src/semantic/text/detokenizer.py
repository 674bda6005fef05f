"""Output tokens → text deltas as they are generated, and stop strings cut out of that text.

Both hold text back rather than emit something they would have to take back: a half-decoded UTF-8
character, or the first characters of what may become a stop string.
"""

from __future__ import annotations

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

    Emits text only once no stop string can begin inside it: the longest tail of the buffer that
    is a proper prefix of some stop string is held back until the next delta decides it. The stop
    string itself and everything after it are never emitted. The first stop to complete wins, so
    the outcome does not depend on how the text was split into deltas.
    """

    def __init__(self, stops: tuple[str, ...]) -> None:
        self.stops = tuple(stop for stop in stops if stop)
        self._held = ""
        self.matched: str | None = None

    def feed(self, delta: str) -> tuple[str, str | None]:
        """(text safe to emit now, the stop string matched by this delta or None)."""
        if self.matched is not None:
            return "", None  # generation is over; later text is discarded
        text = self._held + delta
        cut = self._first_stop(text)
        if cut is not None:
            start, self.matched = cut
            self._held = ""
            return text[:start], self.matched
        keep = self._partial_stop_len(text)
        self._held = text[len(text) - keep :]
        return text[: len(text) - keep], None

    def flush(self) -> str:
        """The held-back text, when generation ends without a stop string."""
        held, self._held = self._held, ""
        return held

    def _first_stop(self, text: str) -> tuple[int, str] | None:
        """(start, stop) of the match that ends first; on a tie, the longer (earlier) one."""
        best: tuple[int, int, str] | None = None
        for stop in self.stops:
            start = text.find(stop)
            if start >= 0:
                key = (start + len(stop), start, stop)
                best = key if best is None or key < best else best
        return None if best is None else (best[1], best[2])

    def _partial_stop_len(self, text: str) -> int:
        """Length of the longest tail of `text` that some stop string starts with."""
        longest = 0
        for stop in self.stops:
            for size in range(min(len(stop) - 1, len(text)), longest, -1):
                if text.endswith(stop[:size]):
                    longest = size
                    break
        return longest
