"""A deterministic runner with no tensors, for scheduler, engine and API tests.

Its "KV cache" is the token id stored in each slot, and its next token is a hash of the context
it reads back through the block tables: each layer group's, within the group's window. So a
wrong block table, a slot written by the wrong sequence or a lost chunk changes the output,
exactly as it would corrupt a real model's. It verifies drafts (speculative decoding) as a
greedy model does: a draft token is accepted when it is the token it would have given there
(under a grammar, the token the grammar leaves it there). Asked for log probabilities, it makes
up a distribution whose likeliest token is the one it gives (`_with_logprobs`).
"""

from __future__ import annotations

import hashlib

import numpy as np

from semantic.cache.pages.page import PageKV
from semantic.core import Batch, BatchItem, CacheSpec, TokenLogprob
from semantic.engine.runner import StepToken, step_tokens
from semantic.text.grammar import GrammarStates, allowed


class FakeRunner:
    verifies_drafts = True

    def __init__(
        self,
        *,
        num_blocks: int = 64,
        block_tokens: int = 16,
        vocab_size: int = 1000,
        first_token_id: int = 0,
        fail_on_token: int | None = None,
        fail_row_on_token: int | None = None,
        layer_windows: tuple[int | None, ...] = (),
        ngram: int | None = None,
    ) -> None:
        """Tokens are drawn from `first_token_id .. vocab_size - 1` (keep special ids below it).
        To test failure paths: a step whose input contains `fail_on_token` raises; an item whose
        context contains `fail_row_on_token` cannot be sampled, while the rest of its step goes
        on (as a row with non-finite probabilities). `layer_windows` gives it layers with
        sliding windows, as a hybrid model has (default: one layer of full attention).
        `ngram` makes the next token a hash of the last `ngram` tokens read, not of all of them:
        an n-gram model, whose output soon repeats itself, so drafts from its context are
        accepted (as a model copying its context accepts them)."""
        layers = len(layer_windows) or 1
        self.cache_spec = CacheSpec(layers, 1, 1, "float32", block_tokens, layer_windows)
        self.num_blocks = num_blocks
        self.vocab_size = vocab_size
        self.first_token_id = first_token_id
        self.fail_on_token = fail_on_token
        self.fail_row_on_token = fail_row_on_token
        self.ngram = ngram
        self.slots: list[int | None] = [None] * (num_blocks * block_tokens)
        self.steps: list[Batch] = []
        self.grammars = GrammarStates(vocab_size)

    def run(self, batch: Batch) -> list[StepToken]:
        self.steps.append(batch)
        if self.fail_on_token is not None and any(
            self.fail_on_token in item.token_ids for item in batch.items
        ):
            raise RuntimeError("injected runner failure")
        size = self.cache_spec.block_tokens
        for source, destination in batch.copies:
            copied = self.slots[source * size : (source + 1) * size]
            self.slots[destination * size : (destination + 1) * size] = copied
        for item in batch.items:
            for group in range(len(item.block_tables)):
                for offset, token in enumerate(item.token_ids):
                    self.slots[self._slot(item, group, item.start_pos + offset)] = token
        outcomes = [(i, self._outcome(item)) for i, item in enumerate(batch.items) if item.sample]
        return step_tokens(len(batch.items), outcomes)

    def forget(self, seq_id: int) -> None:
        self.grammars.release(seq_id)

    def read_block(self, block: int) -> PageKV:
        """The page's slots as "K" of each of its layers (token ids, -1 for empty); "V" is
        zeros."""
        size, layers = self.cache_spec.block_tokens, self.cache_spec.layers_per_group
        slots = self.slots[block * size : (block + 1) * size]
        row = np.array([-1 if s is None else s for s in slots], np.float32)
        k = np.repeat(row[None], layers, 0).reshape(layers, size, 1, 1)
        return PageKV(k, np.zeros_like(k))

    def write_block(self, block: int, kv: PageKV) -> None:
        size = self.cache_spec.block_tokens
        values = [None if x < 0 else int(x) for x in kv.k[0].reshape(-1)]
        self.slots[block * size : (block + 1) * size] = values

    def _slot(self, item: BatchItem, group: int, position: int) -> int:
        block_tokens = self.cache_spec.block_tokens
        page = item.block_tables[group][position // block_tokens]
        return page * block_tokens + position % block_tokens

    def _outcome(self, item: BatchItem) -> int | TokenLogprob | list[int] | Exception:
        if self.fail_row_on_token is not None and self.fail_row_on_token in self._context(item):
            return ValueError("injected sampling failure")
        if item.draft_token_ids:
            return self._verified(item)
        if item.sampling.grammar is not None:
            token = self._constrained_token(item)
        else:
            token = self._next_token(item)
        return self._with_logprobs(item, token)

    def _with_logprobs(
        self, item: BatchItem, token: int | Exception
    ) -> int | TokenLogprob | Exception:
        """`token` with made-up log probabilities when its request asks for them: its own is
        -(token % 8) / 8, and the j-th likeliest after it is the j-th id above it, j lower."""
        if item.sampling.logprobs is None or isinstance(token, Exception):
            return token
        chosen = -(token % 8) / 8
        span = self.vocab_size - self.first_token_id
        top = [
            (self.first_token_id + (token - self.first_token_id + j) % span, chosen - j)
            for j in range(min(item.sampling.logprobs, span))
        ]
        return TokenLogprob(token, chosen, tuple(top))

    def _verified(self, item: BatchItem) -> list[int] | Exception:
        """The draft tokens that are the tokens it would give at their positions, then the one
        it gives after them (under a grammar, each as its matcher leaves it there)."""
        first_draft = item.start_pos + len(item.token_ids) - len(item.draft_token_ids)
        run: list[int] = []
        for offset, drafted in enumerate((*item.draft_token_ids, None)):
            end, generated = first_draft + offset, item.num_output_tokens + offset
            token = (
                self._next_token(item, end)
                if item.sampling.grammar is None
                else self._constrained_token(item, end, generated)
            )
            if isinstance(token, Exception):
                return token
            run.append(token)
            if token != drafted:
                break
        return run

    def _constrained_token(
        self, item: BatchItem, end: int | None = None, generated: int | None = None
    ) -> int | Exception:
        """The hashed token (of the context before `end`, its `generated`-th output token) if
        the item's grammar allows it, else the next id up that it allows (any id, end tokens
        included), as a real runner's mask would leave it."""
        grammar = item.sampling.grammar
        generated = item.num_output_tokens if generated is None else generated
        mask, errors = self.grammars.bitmask([(item.seq_id, grammar, generated)])
        if errors:
            return errors[0]
        permitted = allowed(mask[0], self.vocab_size)
        permitted[list(item.suppress_token_ids)] = False
        if not permitted.any():
            return ValueError("the grammar allows no token here")
        start = self._next_token(item, end)
        token = next(
            t % self.vocab_size
            for t in range(start, start + self.vocab_size)
            if permitted[t % self.vocab_size]
        )
        error = self.grammars.accept(item.seq_id, token)
        return token if error is None else error

    def _context(self, item: BatchItem, end: int | None = None) -> list[int | None]:
        """The tokens the position before `end` (default: its last) reads, group by group,
        through the block tables: all of them, or a sliding group's window."""
        end = item.start_pos + len(item.token_ids) if end is None else end
        context: list[int | None] = []
        for group, layers in enumerate(self.cache_spec.groups):
            start = 0 if layers.window is None else max(0, end - layers.window)
            context += [self.slots[self._slot(item, group, p)] for p in range(start, end)]
        return context

    def _next_token(self, item: BatchItem, end: int | None = None) -> int:
        context = self._context(item, end)
        if self.ngram is not None:
            context = context[-self.ngram :]
        digest = hashlib.blake2b(repr(context).encode(), digest_size=8).digest()
        span = self.vocab_size - self.first_token_id
        token = self.first_token_id + int.from_bytes(digest, "little") % span
        while token in item.suppress_token_ids:
            token = self.first_token_id + (token + 1 - self.first_token_id) % span
        return token
