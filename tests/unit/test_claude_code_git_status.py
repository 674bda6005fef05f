"""A continued Claude Code session in a git repository reads its history from the cache though
its git status changed: each `claude -p` process puts a new snapshot in its system prompt
(`gitStatus:`), before the history; the server renders the session's first one in its later
requests (api/git_snapshots.py), per API key owner, and only in memory.

The bodies are the recorded session of test_claude_code_continued.py (2.1.197: a first
`claude -p`, then `--continue`, then `--resume`, each answered "hi") as if run in a git
repository where the first turn wrote a file: the first process saw a clean tree, the later
ones `?? b.txt` (as a real capture of such a session did, with the section where 2.1.197 puts
it, last in the system prompt).
"""

from __future__ import annotations

import copy
import json
from itertools import pairwise
from pathlib import Path
from typing import Any

import pytest

from semantic.api.anthropic_request import PromptBody, git_status_of, render_prompt
from semantic.api.git_snapshots import MAX_CHARS, MAX_SESSION_CHARS, GitSnapshots
from semantic.models.served import ServedModel
from semantic.text import claude_code
from tests.unit.fakes import running, shared_prefix

FIXTURE = Path(__file__).parent.parent / "fixtures" / "claude_code_2_1_continued_session.json"
RECORDED: dict[str, Any] = json.loads(FIXTURE.read_text())
SESSION = "00000000-0000-4000-8000-000000000027"
TURNS = ("first", "continued", "resumed")
BLOCK = 64  # the fake runner's block: at most one partial block of a shared prefix is not read


def _git_status(status: str) -> str:
    return (
        "gitStatus: This is the git status at the start of the conversation. Note that this "
        "status is a snapshot in time, and will not update during the conversation.\n\n"
        "Current branch: master\n\nMain branch (you will usually use this for PRs): main\n\n"
        f"Status:\n{status}\n\nRecent commits:\n2eef60c first"
    )


CLEAN, WROTE_B = _git_status("(clean)"), _git_status("?? b.txt")
# Another session's (or key's) status, whose prompt is longer than with the first one's.
BUSY = _git_status("\n".join(f"?? file{i}.txt" for i in range(20)))


def _in_git(turn: str, status: str) -> dict[str, Any]:
    """The recorded turn's body, in a git repository whose status is `status`."""
    body: dict[str, Any] = copy.deepcopy(RECORDED[turn])
    last = body["system"][-1]
    last["text"] = last["text"].replace("git repository: false", "git repository: true")
    last["text"] += "\n\n" + status
    return body


def _turn(turn: str) -> dict[str, Any]:
    return _in_git(turn, CLEAN if turn == "first" else WROTE_B)


def _prompt(model: ServedModel, body: dict[str, Any], snapshots: GitSnapshots | None) -> list[int]:
    """The prompt /v1/messages renders for `body`: with the session's first snapshot, or (no
    `snapshots`) with the body's own."""
    prompt = PromptBody.model_validate(body)
    status = git_status_of(prompt)
    if snapshots is not None and status is not None:
        status = snapshots.first(None, SESSION, status)
    return render_prompt(model, prompt, git_status=status)


def _rendered_with(model: ServedModel, body: dict[str, Any], status: str) -> list[int]:
    return render_prompt(model, PromptBody.model_validate(body), git_status=status)


def _answered(model: ServedModel, prompt: list[int]) -> list[int]:
    eos = model.chat_template.eos_token or ""
    return prompt + model.tokenizer.encode(RECORDED["answer"] + eos)


def test_the_section_is_found_and_replaced_word_for_word() -> None:
    blocks = [RECORDED["first"]["system"][1]["text"], _in_git("first", CLEAN)["system"][-1]["text"]]
    assert claude_code.git_status(blocks) == CLEAN
    replaced = claude_code.with_git_status(blocks, WROTE_B)
    assert replaced == [blocks[0], blocks[1].replace(CLEAN, WROTE_B)]
    # Text after the section stays where it was; a prompt without one is left alone.
    assert claude_code.with_git_status([CLEAN + "\n\n# After\nmore"], WROTE_B) == [
        WROTE_B + "\n\n# After\nmore"
    ]
    plain = [RECORDED["first"]["system"][-1]["text"]]
    assert claude_code.git_status(plain) is None
    assert claude_code.with_git_status(plain, WROTE_B) == plain


def test_with_each_processs_own_snapshot_a_continued_turn_parts_before_its_history(
    qwen: ServedModel,
) -> None:
    first = _answered(qwen, _prompt(qwen, _turn("first"), None))
    continued = _prompt(qwen, _turn("continued"), None)
    parted = shared_prefix(first, continued)
    assert parted < len(first)
    assert qwen.tokenizer.decode(continued[:parted]).endswith("Status:\n")


@pytest.mark.parametrize(("earlier", "later"), [("first", "continued"), ("continued", "resumed")])
def test_with_the_first_snapshot_a_later_turn_extends_the_earlier_prompt_and_answer(
    qwen: ServedModel, earlier: str, later: str
) -> None:
    snapshots = GitSnapshots()
    prompts = {turn: _prompt(qwen, _turn(turn), snapshots) for turn in TURNS}
    answered = _answered(qwen, prompts[earlier])
    assert prompts[later][: len(answered)] == answered
    text = qwen.tokenizer.decode(prompts[later], skip_special_tokens=False)
    assert "Status:\n(clean)" in text and "?? b.txt" not in text


def test_each_session_and_each_owner_keeps_its_own_first_snapshot() -> None:
    snapshots = GitSnapshots()
    assert snapshots.first("alice", "s1", CLEAN) == CLEAN
    assert snapshots.first("alice", "s1", WROTE_B) == CLEAN
    assert snapshots.first("alice", "s2", WROTE_B) == WROTE_B
    assert snapshots.first("bob", "s1", WROTE_B) == WROTE_B
    assert snapshots.first(None, "s1", WROTE_B) == WROTE_B
    assert snapshots.peek("carol", "s1") is None and len(snapshots) == 4


def test_the_memory_keeps_the_sessions_used_last_and_no_long_snapshot() -> None:
    snapshots = GitSnapshots(capacity=2)
    snapshots.first(None, "a", "gitStatus: a")
    snapshots.first(None, "b", "gitStatus: b")
    snapshots.first(None, "a", "gitStatus: a2")  # a was used last: b leaves first
    snapshots.first(None, "c", "gitStatus: c")
    assert len(snapshots) == 2
    assert snapshots.peek(None, "a") == "gitStatus: a" and snapshots.peek(None, "b") is None
    long = "gitStatus: " + "x" * MAX_CHARS
    assert snapshots.first(None, "d", long) == long and snapshots.peek(None, "d") is None
    session = "s" * (MAX_SESSION_CHARS + 1)
    assert snapshots.first(None, session, "gitStatus: e") == "gitStatus: e"
    assert snapshots.peek(None, session) is None


def _post(client: Any, body: dict[str, Any], key: str | None = None) -> dict[str, int]:
    headers = {"x-api-key": key} if key else {}
    sent = body | {"max_tokens": 1, "stream": False}
    response = client.post("/v1/messages", json=sent, headers=headers)
    assert response.status_code == 200, response.text
    usage: dict[str, int] = response.json()["usage"]
    return usage


def _prompt_tokens(usage: dict[str, int]) -> int:
    """The whole prompt: computed, written for its breakpoints, and read."""
    cache = usage["cache_read_input_tokens"] + usage["cache_creation_input_tokens"]
    return usage["input_tokens"] + cache


def _other_session(body: dict[str, Any]) -> dict[str, Any]:
    user_id = json.loads(body["metadata"]["user_id"]) | {"session_id": "another"}
    return body | {"metadata": {"user_id": json.dumps(user_id)}}


def test_through_the_server_a_continued_turn_reads_its_history_from_the_cache(
    qwen: ServedModel, tmp_path: Path
) -> None:
    first = _prompt(qwen, _turn("first"), None)
    other = _other_session(_in_git("first", BUSY))
    busy = _in_git("continued", BUSY)
    busy_own = _prompt(qwen, busy, None)  # the body's own snapshot, longer than the first's
    assert len(busy_own) > len(_rendered_with(qwen, busy, CLEAN))
    blocks = 4 * len(busy_own) // BLOCK
    with running(qwen, tmp_path, num_blocks=blocks, block_tokens=BLOCK) as (client, _, _):
        _post(client, _turn("first"))
        continued = _post(client, _turn("continued"))
        # Another session's first request keeps its own snapshot.
        other_usage = _post(client, other)
    assert continued["cache_read_input_tokens"] >= len(first) - BLOCK
    assert _prompt_tokens(other_usage) == len(_prompt(qwen, other, None))
    # After a restart the memory is empty: the first request seen sets the session's snapshot.
    with running(qwen, tmp_path, num_blocks=blocks, block_tokens=BLOCK) as (client, _, _):
        assert _prompt_tokens(_post(client, busy)) == len(busy_own)


def test_through_the_server_one_key_never_sets_anothers_snapshot(
    qwen: ServedModel, tmp_path: Path
) -> None:
    bobs = _in_git("continued", BUSY)
    own = _prompt(qwen, bobs, None)
    assert len(own) > len(_rendered_with(qwen, bobs, CLEAN))
    blocks = 4 * len(own) // BLOCK
    keys = {"api_key": ["alice-key", "bob-key"], "num_blocks": blocks, "block_tokens": BLOCK}
    with running(qwen, tmp_path, **keys) as (client, _, _):
        _post(client, _turn("first"), "alice-key")
        # Bob names Alice's session: he still reads his own snapshot.
        assert _prompt_tokens(_post(client, bobs, "bob-key")) == len(own)


def test_with_qwen25_coders_own_tokenizer_and_template(qwen_coder: ServedModel) -> None:
    model = qwen_coder
    snapshots = GitSnapshots()
    prompts = [_prompt(model, _turn(turn), snapshots) for turn in TURNS]
    for earlier, later in pairwise(prompts):
        answered = _answered(model, earlier)
        assert later[: len(answered)] == answered
