"""One agent's conversation for the cache phases: grown turn by turn to a history of a given size
in tokens (as the server counts them), timed probes at its end, and its *cold twin* — the same
prompt, token for token in length, that shares no cached prefix with anything sent before."""

from __future__ import annotations

import itertools
import string
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import httpx

from semantic_bench.plan import ANSWER_TOKENS, BenchPlan, Message
from semantic_bench.workload import chat_body, stream_chat

# The chat template's tokens around one more user turn (role headers, end markers): a guess
# that only steers the last user message's size; the history is then measured, not assumed.
TURN_OVERHEAD_TOKENS = 10
PROBE_TOKENS = 1  # a probe only needs its first token

WARM_MARKER = "A"
# Every cold twin's first character is one no earlier prompt started with. "R" is left out: the
# other phases' prompts begin with "Run".
_COLD_LETTERS = [c for c in string.ascii_uppercase if c not in (WARM_MARKER, "R")]


def cold_marker(index: int) -> str:
    """The `index`-th cold marker: "B", "C", ... then two letters. Never the warm marker."""
    letters = ""
    index += 1
    while index > 0:
        index, digit = divmod(index - 1, len(_COLD_LETTERS))
        letters = _COLD_LETTERS[digit] + letters
    return letters


def cold_markers() -> Iterator[str]:
    """The run's cold markers, each handed out once: "B", "C", ..."""
    return (cold_marker(index) for index in itertools.count())


@dataclass(slots=True)
class Chat:
    """Where the cache phases send their turns: a client on the target server, the model name
    to ask for, and the run's plan (its tag and tokens per word size every prompt)."""

    client: httpx.AsyncClient
    model: str
    plan: BenchPlan


@dataclass(slots=True, frozen=True)
class Probe:
    """One timed turn: its time to first token and what the server reused of its prompt."""

    ttft_s: float
    prompt_tokens: int
    cached_tokens: int | None  # None: the server does not report prompt_tokens_details


@dataclass(slots=True)
class Conversation:
    """An agent's system prompt and user/assistant turns. `history_tokens` is the history as the
    server counted it: the last turn's prompt tokens plus its answer's. The system prompt opens
    with `WARM_MARKER`, so a twin can change the very first character."""

    session_id: str
    system: str
    turns: list[Message] = field(default_factory=list)
    history_tokens: int = 0

    def messages(self, user: str) -> list[Message]:
        """The history, then one new user message."""
        head: list[Message] = [{"role": "system", "content": self.system}]
        return [*head, *self.turns, {"role": "user", "content": user}]

    def add(self, user: str, answer: str, history_tokens: int) -> None:
        self.turns += [{"role": "user", "content": user}, {"role": "assistant", "content": answer}]
        self.history_tokens = history_tokens

    def cold_twin(self, marker: str, session_id: str) -> Conversation:
        """The same conversation under `session_id` with the system prompt's first character
        replaced: the first token differs, so every block hash of the chain differs and nothing
        cached can be reused, while the prompt keeps its length in tokens."""
        system = marker + self.system[len(WARM_MARKER) :]
        return Conversation(session_id, system, list(self.turns), self.history_tokens)


def new_conversation(plan: BenchPlan, name: str, target_tokens: int) -> Conversation:
    """A conversation with its own session id whose system prompt is half of a history of
    `target_tokens` tokens; `grow_history` adds the other half as turns."""
    opening = f"{WARM_MARKER}. Run {plan.run_tag}, {name}. "
    system = opening + plan.text(name, target_tokens // 2)
    return Conversation(f"bench-{plan.run_tag}-{name}", system)


async def send_probe(chat: Chat, messages: list[Message], session_id: str) -> Probe:
    body = chat_body(chat.model, messages, PROBE_TOKENS, session_id)
    reply = await stream_chat(chat.client, body)
    return Probe(reply.ttft_s, reply.prompt_tokens, reply.cached_tokens)


async def grow_history(
    chat: Chat, convo: Conversation, target_tokens: int, turns: int, on_turn: Callable[[str], None]
) -> None:
    """Add `turns` user/assistant turns to a `new_conversation` so its history ends near
    `target_tokens`: the first turns share the half the system prompt left, sized from the
    plan's tokens per word; the last one closes the gap the server's own counts leave."""
    share = max((target_tokens - target_tokens // 2) // turns - ANSWER_TOKENS, 8)
    for turn in range(turns):
        tokens = share
        if turn == turns - 1 and convo.history_tokens:
            gap = target_tokens - convo.history_tokens - ANSWER_TOKENS - TURN_OVERHEAD_TOKENS
            tokens = max(gap, 8)
        user = f"Turn {turn}: " + chat.plan.text(f"{convo.session_id}-user-{turn}", tokens)
        body = chat_body(chat.model, convo.messages(user), ANSWER_TOKENS, convo.session_id)
        reply = await stream_chat(chat.client, body)
        convo.add(user, reply.text, reply.prompt_tokens + reply.completion_tokens)
        on_turn(f"{convo.session_id} turn {turn}: {convo.history_tokens} tokens")
