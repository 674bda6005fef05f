"""Structured output: JSON schemas (and tool calls' arguments: a forced call's, or those of the
calls a reply opens amid free text) compiled into grammars over the model's vocabulary, and
each sequence's progress through its grammar.

Built on llguidance: it needs no precomputation per schema (a grammar is ready in well under a
millisecond, then masks are computed as the parser goes, tens of microseconds a row), its
matchers never raise on a bad token (a row in error fails alone), and it depends on nothing,
so the fake runner uses it as the torch runner does. `GrammarCompiler` (one per served model)
compiles and caches; `GrammarStates` (one per runner) keeps the matcher of each sequence that
has a grammar, keyed by sequence id, and fills the allowed-token bitmask of each step's rows.
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, cast

import llguidance
import numpy as np

from semantic.core import GrammarSource, OutputGrammar
from semantic.errors import InvalidRequest
from semantic.text.schema_annotations import without_annotations
from semantic.text.tokenizer import Tokenizer

if TYPE_CHECKING:
    from llguidance._lib import JsonCompileOptions

# Separators as `json.dumps` writes them, and no other whitespace: what models were trained on,
# and a small model cannot loop on blank lines.
_JSON_OPTIONS: dict[str, Any] = {
    "item_separator": ", ",
    "key_separator": ": ",
    "whitespace_flexible": False,
}
# A call a small model writes as bare JSON goes on in the spacing it began in (pretty-printed,
# as often as not): held to compact JSON, it would be pushed off the text it was trained on.
_SPACED_JSON_OPTIONS: dict[str, Any] = {"whitespace_flexible": True}
_ANY_JSON_OBJECT = {"type": "object"}
_CACHED_GRAMMARS = 128  # per model
_CACHED_BYTES = 64 * 2**20  # per model, of the grammars' sources (a matcher holds its grammar)
# A request's schemas, without their descriptions, as compact JSON: a client's own schema is a
# few KB, a coding agent's tools' some tens; past it, compiling would cost the server, not it.
MAX_SCHEMA_CHARS = 2**20


class GrammarViolation(ValueError):
    """A sequence's matcher has not seen all of its output, so its mask would be wrong: a fault
    of ours (its row fails alone)."""


class GrammarGaveUp(InvalidRequest):
    """The grammar engine's parser gave up on a sequence's output: it reached one of its
    limits, as a schema whose value can never end (a required property holding the same object
    again) makes it do at the answer's first token. Since each token is one the mask allowed,
    the schema is what failed, and it is the client's: a 400 that names it (its row fails
    alone), not a fault of the engine."""

    def __init__(self, description: str, error: str) -> None:
        reason = error.partition("\n<state>")[0].strip()[:300]  # then its state and grammar
        super().__init__(f"the output cannot follow {description}: {reason}")


@dataclass(slots=True, frozen=True, eq=False)
class Grammar:
    """A compiled grammar: what one request's output must follow. `description` names it in
    errors and logs; a request holds it in its sampling parameters. `lazy`: it holds only the
    tool calls the reply opens, and leaves the text around them (reasoning included) free.

    `start` is a matcher at the grammar's start, built when the grammar is compiled (on a
    worker thread) and never advanced: each sequence's matcher is a copy of it, tens of
    microseconds on the engine thread where building one anew takes up to tens of
    milliseconds for many tools' schemas, a stall of every sequence in the step.

    `source` is what it was compiled from, for an engine whose grammar engine is not this one
    (a vLLM replica's): the JSON schema, or the Lark grammar of tool calls."""

    description: str
    start: llguidance.LLMatcher = field(repr=False)
    source: GrammarSource = field(repr=False)
    lazy: bool = False

    def matcher(self) -> GrammarMatcher:
        return GrammarMatcher(self)


class GrammarMatcher:
    """One sequence's place in its grammar: the tokens it may take next, and each token taken."""

    def __init__(self, grammar: Grammar) -> None:
        self.grammar = grammar
        self._matcher = grammar.start.deep_copy()
        self.consumed = 0  # tokens accepted so far

    def fill(self, row: np.ndarray) -> None:
        """Write the allowed next tokens into `row` (int32 words, one bit per token id)."""
        self._check()
        self._matcher.unsafe_compute_mask_ptr(row.ctypes.data, row.nbytes)
        self._check()

    def accept(self, token: int) -> None:
        if not self._matcher.consume_token(token):
            raise GrammarGaveUp(self.grammar.description, self._matcher.get_error())
        self.consumed += 1

    def _check(self) -> None:
        if self._matcher.is_error():
            raise GrammarGaveUp(self.grammar.description, self._matcher.get_error())


class GrammarCompiler:
    """Grammars over one model's vocabulary, compiled once per schema and kept (an LRU of at
    most `_CACHED_GRAMMARS`, `max_bytes` of their sources). A schema is compiled and keyed
    without its descriptions (they do not change the grammar), by a digest: a client's text
    is hostile, and its size must cost neither memory here nor time. Thread-safe: the API
    compiles on worker threads. The vocabulary is read on first use (a fraction of a second),
    so a server that never constrains output never pays for it."""

    def __init__(self, tokenizer: Tokenizer, vocab_size: int, max_bytes: int = _CACHED_BYTES):
        self._tokenizer = tokenizer
        self.vocab_size = vocab_size
        self.max_bytes = max_bytes
        self._vocabulary: llguidance.LLTokenizer | None = None
        self._specials: dict[str, int] | None = None
        self._cache: OrderedDict[bytes, tuple[Grammar, int]] = OrderedDict()
        self._cached_bytes = 0
        self._lock = threading.Lock()

    def json_schema(self, schema: dict[str, Any] | None, name: str = "the JSON schema") -> Grammar:
        """Output that is one JSON value valid under `schema` (None: any JSON object)."""
        text = _canonical(without_annotations(_ANY_JSON_OBJECT if schema is None else schema))
        source = GrammarSource("json_schema", text)
        return self._compiled(f"json:{text}", name, lambda _: (_json_grammar(text), source))

    def tool_calls(self, form: ToolCallForm) -> Grammar:
        """A reply whose tool calls follow their tools' schemas (`ToolCallForm`)."""
        form = form.without_annotations()
        return self._compiled(
            "tools:" + _canonical(form.key()),
            "the tools' schemas",
            lambda v: _tool_grammar(form, v, self._special_tokens()),
            lazy=not form.forced,
        )

    def _compiled(
        self,
        text: str,
        description: str,
        build: Callable[[llguidance.LLTokenizer], tuple[str, GrammarSource]],
        lazy: bool = False,
    ) -> Grammar:
        """The grammar of `text` (what it is compiled from, as canonical JSON), from the cache
        or built (`build`: llguidance's grammar and its source); an InvalidRequest past
        MAX_SCHEMA_CHARS or for what the engine cannot take."""
        if len(text) > MAX_SCHEMA_CHARS:
            raise InvalidRequest(
                f"{description} is too large: {len(text):,} characters as compact JSON "
                f"without descriptions, over the limit of {MAX_SCHEMA_CHARS:,}"
            )
        key = hashlib.sha256(text.encode()).digest()
        with self._lock:
            cached = self._cache.get(key)
            if cached is not None:
                self._cache.move_to_end(key)
                return cached[0]
            vocabulary = self._vocabulary_locked()
        compiled, source = build(vocabulary)
        error = llguidance.LLMatcher.validate_grammar(compiled, vocabulary)
        if error:
            raise InvalidRequest(f"{description} is not supported: {error[:500]}")
        start = llguidance.LLMatcher(vocabulary, compiled, log_level=0)
        grammar = Grammar(description, start, source, lazy)
        self._keep(key, grammar, len(compiled) + len(source.text))
        return grammar

    def _keep(self, key: bytes, grammar: Grammar, size: int) -> None:
        """Cache `grammar`, dropping the least recently used past the count or the bytes."""
        with self._lock:
            if key in self._cache:
                return
            self._cache[key] = (grammar, size)
            self._cached_bytes += size
            while len(self._cache) > _CACHED_GRAMMARS or self._cached_bytes > self.max_bytes:
                _, (_, dropped) = self._cache.popitem(last=False)
                self._cached_bytes -= dropped

    def _special_tokens(self) -> dict[str, int]:
        """The added tokens the grammar engine takes as special, by their text: a grammar
        names them by id, as a string literal never matches them (Qwen's `<tool_call>` is one,
        though its tokenizer calls it no special token). Read with the vocabulary."""
        with self._lock:
            vocabulary = self._vocabulary_locked()
            if self._specials is None:
                added = json.loads(self._tokenizer.backend_json()).get("added_tokens", [])
                self._specials = {
                    token["content"]: token["id"]
                    for token in added
                    if token["id"] < self.vocab_size and vocabulary.is_special_token(token["id"])
                }
            return self._specials

    def _vocabulary_locked(self) -> llguidance.LLTokenizer:
        if self._vocabulary is None:
            eos = sorted(self._tokenizer.eos_token_ids)
            self._vocabulary = llguidance.LLTokenizer(
                self._tokenizer.backend_json(), n_vocab=self.vocab_size, eos_token=eos or None
            )
        return self._vocabulary


def _canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def _json_grammar(schema_text: str) -> str:
    try:
        options = cast("JsonCompileOptions", _JSON_OPTIONS)
        return llguidance.LLMatcher.grammar_from_json_schema(schema_text, overrides=options)
    except ValueError as exc:
        raise InvalidRequest(f"the JSON schema is not supported: {exc}") from None


@dataclass(slots=True, frozen=True)
class CallShape:
    """One tool a call may name, as the grammar writes it: `lead` (what comes before the
    arguments: the rest of the opener, with the tool's name), the arguments' `schema`, and
    whether it binds (`strict`: a schema the engine cannot take is an error) or is a best
    effort (keywords the engine lacks are ignored; a schema it cannot take at all allows any
    object)."""

    lead: str
    schema: dict[str, Any]
    strict: bool


@dataclass(slots=True, frozen=True)
class Opening:
    """A way a call opens amid free text: the `trigger` text, then one of `shapes`, then
    `closer`. The family's own marker opens a call of any tool, written as the family writes
    it. A `bare` opening is a call a small model writes as bare JSON, in its own spacing:
    `trigger` and `closer` are regular expressions (the trigger names the tool and ends where
    its arguments begin) and the arguments may be spaced as the model likes."""

    trigger: str
    shapes: tuple[CallShape, ...]
    closer: str
    bare: bool = False

    def symbols(self, specials: dict[str, int]) -> tuple[str, str]:
        """The trigger and the closer as Lark symbols (special tokens by id)."""
        if self.bare:
            return f"/{self.trigger}/", f"/{self.closer}/"
        return _symbols(self.trigger, specials), _symbols(self.closer, specials)


@dataclass(slots=True, frozen=True)
class ToolCallForm:
    """How a reply's tool calls must be written. `forced`: the reply starts inside a call of
    one of these tools (after its prefilled opener), ended by `closer`; empty when it starts as
    text. `openings`: how a call opens anywhere after that, in free text; none: nothing follows
    a forced call. `forced_bare`: the forced call is bare JSON, as an opening's can be (its
    arguments in the model's spacing, `closer` a regular expression)."""

    closer: str
    forced: tuple[CallShape, ...] = ()
    openings: tuple[Opening, ...] = ()
    forced_bare: bool = False

    def without_annotations(self) -> ToolCallForm:
        """The form with its schemas' descriptions left out: the grammar is the same."""

        def shapes(group: tuple[CallShape, ...]) -> tuple[CallShape, ...]:
            return tuple(replace(s, schema=without_annotations(s.schema)) for s in group)

        openings = tuple(replace(o, shapes=shapes(o.shapes)) for o in self.openings)
        return replace(self, forced=shapes(self.forced), openings=openings)

    def key(self) -> list[Any]:
        """The form as plain JSON values (what the compiler caches its grammar by)."""

        def shapes(group: tuple[CallShape, ...]) -> list[Any]:
            return [[s.lead, s.schema, s.strict] for s in group]

        openings = [[o.trigger, shapes(o.shapes), o.closer, o.bare] for o in self.openings]
        return [self.closer, shapes(self.forced), openings, self.forced_bare]


def _tool_grammar(
    form: ToolCallForm, vocabulary: llguidance.LLTokenizer, specials: dict[str, int]
) -> tuple[str, GrammarSource]:
    """A Lark grammar: a forced call (one alternative per tool: its lead, `%json{schema}`, the
    closer), then calls anywhere in free text, each opened by one of the openings' triggers.
    Free text runs to a trigger's first appearance (a lazy lexeme), or, where the trigger is a
    special token, to that token. Its source for other grammar engines holds the forced call
    only, then free text (`_forced_source`)."""
    rules: list[str] = []
    start: list[str] = []
    bare = form.forced_bare or any(opening.bare for opening in form.openings)
    if form.forced:
        closer = f"/{form.closer}/" if form.forced_bare else _symbols(form.closer, specials)
        first = _alternatives(
            rules, "first", form.forced, closer, vocabulary, specials, form.forced_bare
        )
        start.append(first)
    source = _forced_source(rules, bool(form.openings), form.forced_bare)
    if form.openings:
        calls = []
        for k, opening in enumerate(form.openings):
            trigger, closer = opening.symbols(specials)
            called = _alternatives(
                rules, f"later{k}", opening.shapes, closer, vocabulary, specials, opening.bare
            )
            if opening.trigger in specials:  # the token itself ends the text: no lazy lexeme
                calls.append(f"TEXT {trigger} {called}")
            else:
                rules.append(f"opened{k}[lazy]: TEXT {trigger}")
                calls.append(f"opened{k} {called}")
        rules += ["TEXT: /(.|\\n)*/", "call: " + " | ".join(calls)]
        start.append("call* TEXT")
    if bare:
        rules.append("SPACE: /[ \\t\\r\\n]+/")
    lark = f"start: {' '.join(start)}\n" + "\n".join(rules)
    return llguidance.LLMatcher.grammar_from_lark(lark), source


def _forced_source(forced_rules: list[str], then_text: bool, bare: bool) -> GrammarSource:
    """The forced call's rules as a grammar of their own, then free text where calls may
    follow: what another grammar engine is given. The calls in that text are held by ours
    alone, since xgrammar (vLLM's first choice) reads lazy rules but compiles only those whose
    body is a single terminal; they are parsed from the text either way. Free text only (no
    constraint at all) when nothing is forced. `bare`: the forced call is in the model's
    spacing (its rules name `SPACE`)."""
    text = ["TEXT: /(.|\\n)*/"]
    if not forced_rules:
        return GrammarSource("lark", "\n".join(["start: TEXT", *text]))
    start = "start: first TEXT" if then_text else "start: first"
    rules = [start, *forced_rules, *(text if then_text else [])]
    if bare:
        rules.append("SPACE: /[ \\t\\r\\n]+/")
    return GrammarSource("lark", "\n".join(rules))


def _alternatives(
    rules: list[str],
    name: str,
    shapes: Sequence[CallShape],
    closer: str,
    vocabulary: llguidance.LLTokenizer,
    specials: dict[str, int],
    bare: bool,
) -> str:
    """Adds a rule per shape (its lead, its arguments, the `closer` symbols) to `rules`;
    returns the rule that is any one of them. `bare`: the arguments in the model's own
    spacing, which may begin with whitespace (`SPACE`, which the caller defines)."""
    options = _SPACED_JSON_OPTIONS if bare else _JSON_OPTIONS
    lead = "SPACE?" if bare else ""
    for i, shape in enumerate(shapes):
        schema = json.dumps(_arguments_schema(shape, vocabulary, options))
        symbols = _symbols(shape.lead, specials) or lead
        rules.append(f"{name}_{i}: {symbols} {name}_args_{i} {closer}")
        rules.append(f"{name}_args_{i}: %json {schema}")
    rules.append(f"{name}: " + " | ".join(f"{name}_{i}" for i in range(len(shapes))))
    return name


def _arguments_schema(
    shape: CallShape, vocabulary: llguidance.LLTokenizer, options: dict[str, Any]
) -> dict[str, Any]:
    """A shape's schema with `options`; a best-effort one is lenient, and when even so the
    engine cannot take it, any object."""
    if shape.strict:
        return {**shape.schema, "x-guidance": options}
    lenient = {**shape.schema, "x-guidance": {**options, "lenient": True}}
    lark = f"start: %json {json.dumps(lenient)}"
    try:
        error = llguidance.LLMatcher.validate_grammar(
            llguidance.LLMatcher.grammar_from_lark(lark), vocabulary
        )
    except ValueError as exc:
        error = str(exc)
    if error:
        return {**_ANY_JSON_OBJECT, "x-guidance": options}
    return lenient


def _symbols(text: str, specials: dict[str, int]) -> str:
    """`text` as Lark symbols: string literals, and the special tokens in it by id."""
    symbols = []
    while text:
        found = [(text.find(t), t) for t in specials if t and t in text]
        if not found:
            symbols.append(_literal(text))
            break
        at, token = min(found)
        symbols += [_literal(text[:at]), f"<[{specials[token]}]>"]
        text = text[at + len(token) :]
    return " ".join(symbol for symbol in symbols if symbol)


def _literal(text: str) -> str:
    """A Lark string literal (empty text is no symbol at all)."""
    return json.dumps(text) if text else ""


class GrammarStates:
    """The grammar matchers of the sequences a runner is computing, by sequence id.

    Owned by a runner and used on the engine thread only. A matcher is made when its sequence
    is first sampled and dropped by `release` when the sequence ends; a preempted sequence keeps
    its own (its output tokens are kept too)."""

    def __init__(self, vocab_size: int) -> None:
        self.words = -(-vocab_size // 32)
        self._matchers: dict[int, GrammarMatcher] = {}

    def bitmask(
        self, rows: Sequence[tuple[int, OutputGrammar | None, int]]
    ) -> tuple[np.ndarray, dict[int, Exception]]:
        """For each row (sequence id, grammar, tokens generated so far): its allowed tokens as
        int32 words (all bits set for a row without a grammar), and the rows that cannot go on
        (their error)."""
        mask = np.full((len(rows), self.words), -1, dtype=np.int32)
        errors: dict[int, Exception] = {}
        for index, (seq_id, grammar, generated) in enumerate(rows):
            if grammar is None:
                continue
            try:
                self._matcher(seq_id, grammar, generated).fill(mask[index])
            except (GrammarViolation, GrammarGaveUp) as exc:
                errors[index] = exc
        return mask, errors

    def accept(self, seq_id: int, token: int) -> Exception | None:
        """Advance a sequence's matcher by its sampled token; the error if the token breaks it."""
        matcher = self._matchers.get(seq_id)
        if matcher is None:
            return None
        try:
            matcher.accept(token)
        except GrammarGaveUp as exc:
            return exc
        return None

    def release(self, seq_id: int) -> None:
        self._matchers.pop(seq_id, None)

    def __len__(self) -> int:
        return len(self._matchers)

    def _matcher(self, seq_id: int, grammar: OutputGrammar, generated: int) -> GrammarMatcher:
        matcher = self._matchers.get(seq_id)
        if matcher is None:
            matcher = self._matchers[seq_id] = grammar.matcher()
        if matcher.consumed != generated:  # a token it never saw: its state would be wrong
            raise GrammarViolation(
                f"the grammar has seen {matcher.consumed} of this sequence's {generated} tokens"
            )
        return matcher


def allowed(mask_row: np.ndarray, vocab_size: int) -> np.ndarray:
    """A bitmask row as booleans per token id, `[vocab_size]`."""
    bits = np.unpackbits(mask_row.view(np.uint8), bitorder="little")
    return bits[:vocab_size].astype(bool)
