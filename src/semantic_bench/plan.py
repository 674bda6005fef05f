"""What the benchmark says: deterministic prompt text and the plan of every prompt both the
server and the `transformers` baseline run, sized in tokens from a measured tokens-per-word."""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass

Message = dict[str, str]
DECODE_TOKENS = 128
PREFILL_TOKENS = 1000
# Answers while a history grows: the cache phases measure prefill, so answers stay short.
ANSWER_TOKENS = 16

_SUBJECTS = (
    "The archivist", "A field engineer", "The night shift", "Our compiler", "The harbor master",
    "A careful reviewer", "The weather station", "The second team", "An old library",
    "The scheduler", "A visiting botanist", "The river pilot",
)  # fmt: skip
_VERBS = (
    "records", "inspects", "rebuilds", "questions", "measures", "summarizes", "compares",
    "repairs", "catalogues", "forecasts", "translates", "audits",
)  # fmt: skip
_OBJECTS = (
    "the tidal tables", "every failing test", "the budget for spring", "a map of the valley",
    "the cache statistics", "three unsigned letters", "the copper wiring", "the seed catalogue",
    "a list of open questions", "the orbital data", "the lighthouse logbook", "our release notes",
)  # fmt: skip
_CODAS = (
    "before dawn", "with great patience", "twice a week", "without asking why",
    "for the third time", "in plain language", "under a grey sky", "after the long meeting",
    "as the snow melts", "while the kettle boils",
)  # fmt: skip


def sentences(seed: str, words: int) -> str:
    """`words` words of varied, deterministic sentences: the same seed gives the same text."""
    rng = random.Random(seed)
    out: list[str] = []
    while len(out) < words:
        parts = (rng.choice(_SUBJECTS), rng.choice(_VERBS), rng.choice(_OBJECTS))
        out.extend(f"{' '.join(parts)} {rng.choice(_CODAS)}.".split())
    text = " ".join(out[: max(words, 1)])
    return text if text.endswith(".") else text + "."


@dataclass(slots=True, frozen=True)
class WorkloadSpec:
    """The shape of the workload, in tokens as the target's tokenizer counts them (roughly)."""

    agents: int
    turns: int
    system_tokens: int
    user_tokens: int
    max_tokens: int
    seed: int = 0


@dataclass(slots=True, frozen=True)
class AgentScript:
    """One agent's fixed inputs: a system prompt and one user message per turn. Its answers come
    from the model at run time, so each side (server, baseline) threads in its own."""

    index: int
    session_id: str
    system: str
    users: tuple[str, ...]

    def messages(self, answers: list[str]) -> list[Message]:
        """The conversation for turn `len(answers)`: system, then user/assistant pairs."""
        out: list[Message] = [{"role": "system", "content": self.system}]
        for user, answer in zip(self.users, answers, strict=False):
            out += [{"role": "user", "content": user}, {"role": "assistant", "content": answer}]
        out.append({"role": "user", "content": self.users[len(answers)]})
        return out


@dataclass(slots=True, frozen=True)
class BenchPlan:
    """All text both the server and the baseline run, built once so both see the same prompts."""

    run_tag: str
    tokens_per_word: float
    decode_messages: list[Message]
    concurrent_messages: list[list[Message]]  # one short prompt per agent, decoded at once
    prefill_messages: list[Message]
    agents: list[AgentScript]
    max_tokens: int
    user_tokens: int = 50  # the size of a new user message in every phase
    seed: int = 0

    def text(self, name: str, tokens: int) -> str:
        """About `tokens` tokens of text, the same for the same name in every run."""
        return sized_text(f"{self.seed}-{name}", tokens, self.tokens_per_word)


def sized_text(seed: str, tokens: int, tokens_per_word: float) -> str:
    """`sentences()` sized in tokens through a measured tokens-per-word."""
    return sentences(seed, max(1, round(tokens / tokens_per_word)))


def build_plan(spec: WorkloadSpec, tokens_per_word: float, run_tag: str) -> BenchPlan:
    """Prompts sized in tokens through `tokens_per_word`. The run tag opens every prompt, so
    nothing an earlier run left in the server's cache can turn this run's cold turns warm."""

    def text(seed: str, tokens: int) -> str:
        return sized_text(f"{spec.seed}-{seed}", tokens, tokens_per_word)

    agents = agent_scripts(spec, run_tag, text, group="agent")
    story = f"Run {run_tag}. Tell a long story about this: " + text("story", 25)
    stories = [
        f"Run {run_tag}, agent {i}. Tell a long story about this: " + text(f"story-{i}", 25)
        for i in range(spec.agents)
    ]
    probe = f"Run {run_tag}, prefill probe. " + text("prefill", PREFILL_TOKENS)
    return BenchPlan(
        run_tag=run_tag,
        tokens_per_word=tokens_per_word,
        decode_messages=[{"role": "user", "content": story}],
        concurrent_messages=[[{"role": "user", "content": s}] for s in stories],
        prefill_messages=[
            {"role": "system", "content": probe},
            {"role": "user", "content": "Go on."},
        ],
        agents=agents,
        max_tokens=spec.max_tokens,
        user_tokens=spec.user_tokens,
        seed=spec.seed,
    )


def agent_scripts(
    spec: WorkloadSpec, run_tag: str, text: Callable[[str, int], str], group: str
) -> list[AgentScript]:
    """`spec.agents` scripts; `group` ("agent", "pressure") keeps each phase's agents, session
    ids and prompts apart from every other phase's."""
    return [_agent_script(spec, i, run_tag, text, group) for i in range(spec.agents)]


def _agent_script(
    spec: WorkloadSpec, i: int, run_tag: str, text: Callable[[str, int], str], group: str
) -> AgentScript:
    users = tuple(
        f"Agent {i}, turn {t}: " + text(f"{group}-user-{i}-{t}", spec.user_tokens)
        for t in range(spec.turns)
    )
    return AgentScript(
        index=i,
        session_id=f"bench-{run_tag}-{group}-{i}",
        system=f"Run {run_tag}, {group} {i}. " + text(f"{group}-system-{i}", spec.system_tokens),
        users=users,
    )
