"""A model runner that says what a test tells it to, through the real engine and scheduler.

A small model cannot be relied on to call a tool, so tests of the tool path script the reply:
each new sequence answers with the next queued list of token ids (a real tokenizer's encoding
of a chosen reply), then the end token. Everything else is the fake runner's: its "KV cache"
holds token ids, so the prompt a sequence saw (cached prefix included) can be read back.
"""

from __future__ import annotations

from collections import deque
from typing import Any

from semantic.backends.fake import FakeRunner
from semantic.core import BatchItem


class ScriptedRunner(FakeRunner):
    verifies_drafts = False  # its script goes by output token, not by position: no drafts

    def __init__(self, *, end_token_id: int, **fake_runner_args: Any) -> None:
        super().__init__(**fake_runner_args)
        self.end_token_id = end_token_id
        self.replies: deque[list[int]] = deque()  # one per request to come, in order
        self.prompts: list[list[int]] = []  # the whole prompt each sequence saw, in order
        self._scripts: dict[int, list[int]] = {}  # by sequence id

    def say(self, *replies: list[int]) -> None:
        """Queue the token ids the next requests answer with (the end token follows each)."""
        self.replies.extend(replies)

    def _next_token(self, item: BatchItem, end: int | None = None) -> int:
        script = self._scripts.get(item.seq_id)
        if script is None:
            prompt = self._context(item)
            self.prompts.append([token for token in prompt if token is not None])
            reply = self.replies.popleft() if self.replies else []
            script = self._scripts[item.seq_id] = [*reply, self.end_token_id]
        return script[min(item.num_output_tokens, len(script) - 1)]
