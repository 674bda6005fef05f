"""What one `semantic bench` run measures: `BenchOptions`, and the phases it can run (`Phase`),
with the rule for which of them apply to the target (a restart needs a server we spawned)."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field, replace
from pathlib import Path

from semantic_bench.errors import BenchError
from semantic_bench.plan import ANSWER_TOKENS, WorkloadSpec


class Phase(enum.StrEnum):
    """The phases, in the order a run takes them (calibration always runs first)."""

    DECODE = "decode"  # single-stream decode speed
    CONCURRENT = "concurrent"  # one stream per agent, all decoding at once
    PREFILL = "prefill"  # one fresh ~1k-token prompt
    WORKLOAD = "workload"  # concurrent agents, several turns each
    HISTORY = "history"  # cold vs warm TTFT as an agent's history grows
    RESTART = "restart"  # an agent's next turn after the server restarted
    PRESSURE = "pressure"  # more agents than the pool holds, one turn at a time
    CROWD = "crowd"  # more agents than the pool holds, all at once
    BASELINE = "baseline"  # the same decode/prefill/workload through transformers

    @classmethod
    def parse(cls, text: str) -> tuple[Phase, ...]:
        """A comma-separated list, e.g. "history,restart", kept in the run's order."""
        names = {name.strip() for name in text.split(",") if name.strip()}
        unknown = names - {phase.value for phase in cls}
        if unknown or not names:
            known = ", ".join(phase.value for phase in cls)
            raise BenchError(f"unknown phase(s) {', '.join(sorted(unknown)) or '(none)'}; "
                             f"known: {known}")  # fmt: skip
        return tuple(phase for phase in cls if phase.value in names)


class Clients(enum.StrEnum):
    """How the crowd's requests say who sent them, in the order the runs take them. Anonymous
    first: on a target the runs share (a given URL), the named agents' blocks still rank above
    one-off work when the next run begins, and semantic keeps one-off requests from them."""

    ANONYMOUS = "anonymous"  # no session id at all
    NAMED = "named"  # a session_id in every body

    @classmethod
    def parse(cls, text: str) -> tuple[Clients, ...]:
        """The kinds a word names: "anonymous", "named" or "both" (in the runs' order)."""
        if text == "both":
            return tuple(cls)
        try:
            return (cls(text),)
        except ValueError:
            raise BenchError(f"clients must be named, anonymous or both, not {text!r}") from None


# The phases the baseline repeats: it has no cache, so the cache phases have nothing to compare.
BASELINE_PHASES = (Phase.DECODE, Phase.PREFILL, Phase.WORKLOAD)
DEFAULT_HISTORY_SIZES = (1000, 2000, 4000)


@dataclass(slots=True)
class BenchOptions:
    """What to measure and how. `base_url=None` spawns `semantic serve` with `server_args` and a
    cache folder: `cache_dir`, or a fresh temporary one so no run reuses an old cache unasked.
    `served_model` is the model name sent in requests (default: `model`), for servers such as
    vLLM or ollama that insist on their own name; `model` also picks the baseline's weights.
    `command` is the command line the report quotes."""

    base_url: str | None = None
    model: str = "smollm2-135m"
    agents: int = 8
    turns: int = 3
    system_tokens: int = 1000
    user_tokens: int = 50
    max_tokens: int = 64
    baseline: bool = True
    json_out: Path | None = None
    markdown_out: Path | None = None
    server_args: list[str] = field(default_factory=list)
    served_model: str | None = None
    api_key: str | None = None
    seed: int = 0
    phases: tuple[Phase, ...] = tuple(Phase)
    history_sizes: tuple[int, ...] = DEFAULT_HISTORY_SIZES
    repeats: int = 3
    restart_agents: int = 4
    pressure_agents: int = 12
    pressure_turns: int = 3
    crowd_agents: int = 16
    crowd_turns: int = 4
    crowd_system_tokens: int | None = None  # None: `system_tokens`
    crowd_answer_tokens: int = 64
    crowd_pool_factor: float = 1.5  # the crowd's final histories ÷ the pool of its server
    crowd_clients: tuple[Clients, ...] = tuple(Clients)
    cache_dir: Path | None = None
    command: str | None = None

    def __post_init__(self) -> None:
        sizes = (self.agents, self.turns, self.system_tokens, self.user_tokens, self.max_tokens)
        if min(sizes) < 1:
            raise BenchError("agents, turns, system/user tokens and max_tokens must be ≥ 1")
        counts = (self.repeats, self.restart_agents, self.pressure_agents)
        if min(counts) < 1 or self.pressure_turns < 2:
            raise BenchError("repeats and agent counts must be ≥ 1, pressure turns ≥ 2")
        if not self.history_sizes or min(self.history_sizes) < 100:
            raise BenchError("history sizes must be given, each at least 100 tokens")
        self._check_crowd()
        if self.base_url is not None and (self.server_args or self.cache_dir):
            raise BenchError(
                "--cache-dir and server arguments after -- apply only when the bench spawns a "
                "server"
            )

    def _check_crowd(self) -> None:
        sizes = (self.crowd_agents, self.crowd_system_tokens or 1, self.crowd_answer_tokens)
        if min(sizes) < 1 or self.crowd_turns < 2 or not self.crowd_clients:
            raise BenchError("crowd agents and sizes must be ≥ 1, crowd turns ≥ 2, and some "
                             "clients named")  # fmt: skip
        if not self.crowd_pool_factor > 0:
            raise BenchError(f"the crowd's pool factor must be > 0, not {self.crowd_pool_factor}")

    @property
    def spawns(self) -> bool:
        return self.base_url is None

    @property
    def spec(self) -> WorkloadSpec:
        return WorkloadSpec(
            agents=self.agents,
            turns=self.turns,
            system_tokens=self.system_tokens,
            user_tokens=self.user_tokens,
            max_tokens=self.max_tokens,
            seed=self.seed,
        )

    @property
    def pressure_spec(self) -> WorkloadSpec:
        """The pressure agents: the workload's prompt sizes, short answers, round-robin turns."""
        return replace(
            self.spec,
            agents=self.pressure_agents,
            turns=self.pressure_turns,
            max_tokens=ANSWER_TOKENS,
        )

    @property
    def crowd_spec(self) -> WorkloadSpec:
        """The crowd: the workload's user messages, its own agents, turns and answers, and the
        workload's system prompts unless given its own."""
        return replace(
            self.spec,
            agents=self.crowd_agents,
            turns=self.crowd_turns,
            system_tokens=self.crowd_system_tokens or self.system_tokens,
            max_tokens=self.crowd_answer_tokens,
        )

    def runnable_phases(self) -> tuple[Phase, ...]:
        """The asked-for phases that apply to this target; `skip_notes()` says why the rest
        don't."""
        return tuple(phase for phase in self.phases if self._skip_reason(phase) is None)

    def skip_notes(self) -> list[str]:
        notes = []
        for phase in self.phases:
            reason = self._skip_reason(phase)
            if reason is not None:
                notes.append(f"{phase.value} phase skipped: {reason}")
        return notes

    def _skip_reason(self, phase: Phase) -> str | None:
        if phase is Phase.RESTART and not self.spawns:
            return "it restarts the server, so it needs one the bench spawned (no --base-url)"
        if phase is Phase.BASELINE and not self.baseline:
            return "--no-baseline"
        if phase is Phase.BASELINE and not set(BASELINE_PHASES) & set(self.phases):
            return "it repeats decode, prefill and workload, and none of them runs"
        return None
