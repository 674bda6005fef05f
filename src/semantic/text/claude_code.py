"""Claude Code's per-request churn, removed before templating so a session keeps its prefix.

Claude Code sends text that changes on every request without changing what the model should
do. Each change moves the first token where this prompt differs from the last one's, and the
server prefills everything after it again: a billing header with a per-request hash as the first
system block means the whole prompt, every turn; a token countdown in
the history means everything after it. Pure functions over text: they know nothing of HTTP,
templates or token ids.

Known cases, each with a test in tests/unit/test_anthropic_hygiene.py:
- `x-anthropic-billing-header: cc_version=…; cc_entrypoint=…; cch=<hash>;` as a system block
  (Claude Code ≥ 2.1.36; `cch` changes every request). Stripped.
- `<total_tokens>N tokens left</total_tokens>`, as a whole `role: system` message (bare or in a
  `<system-reminder>`), after most user turns; N changes every turn and Claude Code prunes old
  ones from the history, rewriting the prefix from there. Stripped.
- `<system-reminder>` blocks that hold only a countdown — `Token usage: N/M; K remaining`,
  `Output tokens — turn: … · session: …`, `USD budget: $…/$…; $… remaining`,
  `Remaining conversation turns: …`, `Messages until auto-compact: …` — standalone or stuck to
  the end of a tool result. Stripped.
- The 1M-context marker on the model's name: ` (1M context)` after its display name and
  `[1m]` after its id, in the system prompt (`# Environment`) and the Bash tool's description
  (its commit trailer). A session's first process runs on the 1M-context variant; `--continue`
  and `--resume` run on the plain model (the transcript records the id the API answered with),
  so later turns say `Opus 4.8` where the first said `Opus 4.8 (1M context)`. The prompts then
  parted in the tools, ~1K tokens in: a continued turn read 5% of its 19,885 tokens from the
  cache, its history included. Stripped from the system prompt and the tools' descriptions, so
  every turn names the model as the later ones do.
- A new git status in each process: `claude -p --continue` and `--resume` each take a new
  snapshot (`gitStatus:`, "the git status at the start of the conversation"), which sits
  before the history; once a turn wrote a file, the next process's prompt parted there (a
  recorded turn at token 19,795 of 19,967). Not churn to strip (the model reads it), so
  `git_status` finds the section and `with_git_status` puts back the one the session started
  with, which the server keeps per session (api/git_snapshots.py; tests in
  tests/unit/test_claude_code_git_status.py).
Left alone on purpose: the date (Claude Code 2.1 sends it in a `<system-reminder>` at the head
of the first user turn, after everything sessions share), reminders that carry instructions
(todo-list nudges, file-change notices: their text is meaning, not churn), and
`<usage><total_tokens>N</total_tokens>…` inside subagent results (data the model reads; it has
no "tokens left").

Per-session sections, moved rather than removed (`split_session`): a new session's first
request is ~19K tokens, ~17K of them instructions and tools that every session shares; but
the system prompt names this session's memory folder (home and project), working folder and
git status, and templates such as Qwen's put the tools after the system prompt. Two sessions'
prompts then part ~440 tokens in, and each new session prefills the shared ~17K again.
`split_session` parts the system prompt into what every session shares and the sections that
are this session's own, each kept word for word, so that the request builder can put the
session's sections after the shared text and the tools (api/anthropic_request.py).

Subagents (the Agent tool) start warm too (`split_identity`): a subagent's system prompt is its
agent type's instructions (~550 tokens, not the session's ~1,300), after the same one-line
identity block, and its tools are the session's less a few (same schemas, same order). With
the tools after the instructions, a session's first subagent shared 17 tokens with the
session's request; with the identity line and the tools first, it shares them up to the first
one only the session has (5,914 of 11,385 tokens on Qwen2.5-Coder, 2.1.197). A second subagent
of the same type shares all but its task with the first (99.8%).
"""

from __future__ import annotations

import re

# The billing line, and the line break after it when other text follows in the same block.
_BILLING_HEADER = re.compile(r"\A\s*+x-anthropic-billing-header:[^\n]*+(?:\n|\Z)")

# Every pattern here runs over client text (tool output of any size), so each is linear in it:
# quantifiers are possessive (`++`, `*+`: they never give back what they took) or inside an
# atomic group (`(?>…)`), so no attempt backtracks; and a countdown's free text stops at `<` as
# well as at a line's end, so one attempt never reads past the next tag, and attempts at
# successive tags read disjoint stretches of the text. (With plain `[^\n]+` twice on one line,
# 300 repeats of `<system-reminder>Output tokens — turn: · session: ` took seconds, growing as
# the cube of the length: benchmarks/hostile_text.py measures each pattern.)
_FREE_TEXT = r"[^\n<]"
_TOTAL_TOKENS = r"<total_tokens>\s*+\d++ tokens left\s*+</total_tokens>"
_COUNTDOWNS = (
    _TOTAL_TOKENS,
    r"Token usage: \d++/\d++; \d++ remaining",
    # The turn's figure ends at the first ` · session: `; the session's runs to the tag.
    rf"Output tokens — turn: (?>{_FREE_TEXT}+? · session: ){_FREE_TEXT}++",
    r"USD budget: \$[\d.,]++/\$[\d.,]++; \$[\d.,]++ remaining",
    rf"Remaining conversation turns: {_FREE_TEXT}*+",
    rf"Messages? until auto-compact: {_FREE_TEXT}*+",
)
# A reminder that holds nothing but a countdown, or a bare `<total_tokens>` marker.
_CHURN = re.compile(
    r"<system-reminder>\s*+(?:" + "|".join(_COUNTDOWNS) + r")\s*+</system-reminder>"
    r"|" + _TOTAL_TOKENS
)


def is_billing_header(text: str) -> bool:
    return _BILLING_HEADER.match(text) is not None


def strip_billing_header(text: str) -> str:
    """`text` without a leading billing-header line (the rest of the block, if any, stays)."""
    return _BILLING_HEADER.sub("", text, count=1)


def strip_countdowns(text: str) -> str:
    """`text` without token/budget countdown reminders, and without the whitespace that joined
    each to the text before it (or after it, at the start); "" when nothing else was there."""
    if "<total_tokens>" not in text and "<system-reminder>" not in text:
        return text  # the common case, and no regex over megabytes of tool output
    *kept, last = _CHURN.split(text)
    if not kept:
        return text
    return "".join([*(part.rstrip() for part in kept), last]).lstrip()


# The marker of a model's 1M-context variant: after its display name, which ends in its version
# ("Opus 4.8 (1M context)"), and after its id or alias ("claude-opus-4-8[1m]", "opus[1M]").
_LONG_CONTEXT = re.compile(r"(?<=\d) \(1M context\)|(?<=\w)\[1m\]", re.IGNORECASE)


def strip_long_context(text: str) -> str:
    """`text` with the model named as a continued session names it: without the 1M-context
    marker, which only a session's first process writes."""
    return _LONG_CONTEXT.sub("", text)


def clean_system(blocks: list[str]) -> list[str]:
    """The system prompt's text blocks without the billing header, countdowns or the model's
    1M-context marker; blocks left empty are dropped."""
    cleaned = (
        strip_long_context(strip_countdowns(strip_billing_header(block))) for block in blocks
    )
    return [block for block in cleaned if block.strip()]


# Claude Code's system prompt is Markdown: each section starts at a `# Heading` line, and a
# `gitStatus:` paragraph closes it. These sections are a session's own: `# Memory` names its
# memory folder (under the home folder, named for the project), `# Environment` its working
# folder and whether it is a git repository, `gitStatus:` its branch, changes and commits. In
# `--bare` mode the whole prompt after the identity line is the working folder and the date
# (`CWD: …` then `Date: …`, a line each).
_SECTION_START = re.compile(r"^(?=# |gitStatus: |CWD: )", re.MULTILINE)
_SESSION_SECTIONS = ("# Environment\n", "# Memory\n", "gitStatus: ", "CWD: ")
# Before 2.1, the environment was an `<env>` element after a line that introduced it. Anchored
# at a line's start and read a line at a time, so a search is linear in the text.
_ENV_ELEMENT = re.compile(r"^[^\n]*+\n<env>\n(?:[^\n]*+\n)*?</env>(?:\n|\Z)", re.MULTILINE)


def split_session(system: str) -> tuple[str, str]:
    """`system` as (what every session shares, what only this session says): its per-session
    sections (and an `<env>` element) moved, whole and in order, from the first part to the
    second; ("system", "") when it has none (any client but Claude Code)."""
    envs = _ENV_ELEMENT.findall(system)
    parts = _SECTION_START.split(_ENV_ELEMENT.sub("", system))
    own = [part for part in parts if part.startswith(_SESSION_SECTIONS)]
    if not own and not envs:
        return system, ""
    shared = "".join(part for part in parts if not part.startswith(_SESSION_SECTIONS))
    return shared.rstrip(), "\n\n".join(part.strip() for part in [*envs, *own])


_GIT_STATUS = "gitStatus: "


def git_status(blocks: list[str]) -> str | None:
    """The `gitStatus:` section of a system prompt's blocks (the repository as its process
    found it at start), without the blank lines around it; None when there is none."""
    for block in blocks:
        for part in _SECTION_START.split(block):
            if part.startswith(_GIT_STATUS):
                return part.strip()
    return None


def with_git_status(blocks: list[str], status: str) -> list[str]:
    """`blocks` with their (first) `gitStatus:` section replaced by `status`, the text around
    it kept; `blocks` as they are when they have none."""
    for index, block in enumerate(blocks):
        parts = _SECTION_START.split(block)
        found = next((i for i, part in enumerate(parts) if part.startswith(_GIT_STATUS)), None)
        if found is not None:
            old = parts[found]
            parts[found] = status + old[len(old.rstrip()) :]
            return [*blocks[:index], "".join(parts), *blocks[index + 1 :]]
    return blocks


# Claude Code's identity line ("You are Claude Code, Anthropic's official CLI for Claude.", or
# the Agent SDK's in print mode) is a block of its own, the same for a session and its subagents.
_IDENTITY_MAX_CHARS = 200


def split_identity(blocks: list[str]) -> tuple[str, list[str]]:
    """`blocks` (a system prompt's, cleaned) as (its one-line identity block, the rest); ("",
    blocks) when the first block is not one short line followed by more."""
    first = blocks[0].strip() if len(blocks) > 1 else ""
    if not first or "\n" in first or len(first) > _IDENTITY_MAX_CHARS:
        return "", blocks
    return first, blocks[1:]
