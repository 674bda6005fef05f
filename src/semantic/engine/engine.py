"""The engine thread: one loop owns the scheduler, the block pool and the runner.

The asyncio side changes engine state only through messages on a queue (submit, abort, call,
stop; a call runs a function on the engine thread between steps), and each request's events come
back through the callback it was submitted with. The few reads made off the thread are listed on
`Engine`.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import queue
import threading
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import asdict, dataclass
from typing import Any, TypeVar

from semantic.cache.agents.persist import EvictResult, PersistResult
from semantic.cache.agents.store import Agents
from semantic.cache.agents.write_behind import WriteBehind
from semantic.cache.disk.tier import BlockRecord
from semantic.cache.disk.tiering import Tiering
from semantic.cache.pages.block_pool import BlockPool
from semantic.cache.pages.prefix import PrefixCache
from semantic.core import (
    AgentKey,
    Batch,
    FinishReason,
    Request,
    Restore,
    Sequence,
    SequenceStatus,
    TokenEvent,
    TokenLogprob,
    Usage,
)
from semantic.engine.agent_door import AgentDoor
from semantic.engine.port import Capabilities
from semantic.engine.runner import ModelRunner, StepToken
from semantic.engine.scheduler import Scheduler
from semantic.engine.snapshot import EngineSnapshot, EngineStats
from semantic.errors import (
    ContextOverflow,
    EngineFailure,
    InvalidRequest,
    Overloaded,
    PoolExhausted,
    RowsFailed,
    SemanticError,
    Unavailable,
)
from semantic.models.served import ServedModel
from semantic.observability import (
    EngineMetrics,
    EngineReading,
    PrefillProgress,
    read_engine,
    request_fields,
)
from semantic.settings.options import EngineOptions
from semantic.text.detokenizer import IncrementalDetokenizer, StopMatcher

log = logging.getLogger(__name__)
T = TypeVar("T")

EventSink = Callable[[TokenEvent], None]


@dataclass(slots=True)
class _Submit:
    request: Request
    sink: EventSink
    announce: bool = False  # send the first event (no tokens, its cache miss) on arrival


@dataclass(slots=True)
class _Restored:
    """Blocks the disk reader brought back for a sequence waiting on `restore`."""

    seq: Sequence
    restore: Restore
    records: list[BlockRecord]


@dataclass(slots=True)
class _Abort:
    request_id: str


class _Stop:
    pass


@dataclass(slots=True)
class _Call:
    """Run `function` on the engine thread, which owns the pool and the store."""

    function: Callable[[], Any]
    reply: Callable[[Any, BaseException | None], None]


@dataclass(slots=True)
class _Active:
    """A request the engine is working on, with its text state."""

    seq: Sequence
    sink: EventSink
    detokenizer: IncrementalDetokenizer
    stops: StopMatcher


@dataclass(slots=True, frozen=True)
class EngineParts:
    """What an engine runs besides its runner, built for one runner and model
    (`engine/wiring.py: build_parts`)."""

    pool: BlockPool  # the runner's pages, by number: free, held or cached
    prefix: PrefixCache  # cached prefixes by chained hash, in the pool and on disk
    tiering: Tiering  # the disk tier below the pool, and the traffic to and from it
    agents: Agents  # named agents, their histories and conversations, the cache's statistics
    write_behind: WriteBehind  # an agent's new pages, written to disk behind each turn
    scheduler: Scheduler


class Engine:
    """Runs requests to completion, many at a time: the engine port's own implementation
    (`engine/port.py`), with every capability.

    `stream()` is the asyncio entry point; `submit()` + `run_until_idle()` drive the engine
    without its thread (tests). Only the engine thread (or the caller of `run_until_idle`)
    writes the scheduler, the pool, the prefix index, the agents and `_active`. Other threads
    read some of it without a lock: `stats()` reads sizes of the scheduler and the pool;
    `progress()` two counts of a request's sequence;
    `PendingPersist.wait` reads agents to write manifests; the disk reader and writer threads
    read the disk tier, which locks inside. `metrics` is Prometheus objects, which lock inside:
    /metrics collects them from any thread.
    """

    capabilities = Capabilities(
        agents=True, swap=True, cache_miss=True, structured_output=True, logprobs=True
    )

    def __init__(
        self, runner: ModelRunner, model: ServedModel, options: EngineOptions, parts: EngineParts
    ) -> None:
        """`parts` are built for `runner` and `model` (`engine/wiring.py: build_parts`)."""
        self.runner = runner
        self.model = model
        self.options = options
        self.pool = parts.pool
        self.prefix = parts.prefix
        self.tiering = parts.tiering
        self.agents = parts.agents
        self.write_behind = parts.write_behind
        self.scheduler = parts.scheduler
        self.agent_door = AgentDoor(self)
        # A sequence never outgrows the context, nor the whole pool (then it could not run).
        pool_tokens = self.scheduler.blocks.max_tokens(runner.num_blocks)
        limit = model.context_length if pool_tokens is None else pool_tokens
        self.max_seq_tokens = min(model.context_length, limit)
        self.metrics = EngineMetrics()
        self.prefill_progress = PrefillProgress()  # log lines while a long prompt is computed
        self._inbox: queue.SimpleQueue[_Message] = queue.SimpleQueue()
        self._active: dict[str, _Active] = {}
        self._seq_ids = itertools.count()
        self._thread: threading.Thread | None = None
        self._stopping = False
        self._closed = False
        # Set once by `cancel_all`: every request from then on fails with it. The lock makes
        # "refused, or queued before the refusal" exact, so none waits on a stopped engine.
        self._refusal: Exception | None = None
        self._refusal_lock = threading.Lock()
        self._inbox_closed = False  # set once, under the lock, when the engine has stopped

    # -- the asyncio side ------------------------------------------------------------------

    def start(self) -> None:
        """Start the engine thread: once, since a stopped engine has persisted and closed its
        caches."""
        if self._thread is not None or self._closed:
            raise RuntimeError("an engine starts once")
        self._stopping = False
        self._thread = threading.Thread(target=self._loop, name="semantic-engine", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 60.0) -> None:
        """Abort what is running, persist every hot cache, and end the thread."""
        if self._thread is None:
            self._shut_down()
            return
        self._inbox.put(_Stop())
        self._thread.join(timeout)
        self._thread = None

    def stream(self, request: Request, *, announce: bool = False) -> AsyncIterator[TokenEvent]:
        """Submit `request` and return its events. Raises at once if it can never run; closing
        the iterator early (a client that went away) aborts the request. With `announce`, the
        first event comes as soon as the engine takes the request in (before any token, so a
        response's headers can say where and why its prompt missed the cache: `cache_miss`),
        or is refused."""
        self.check(request)
        return self._events(request, announce)

    async def _events(self, request: Request, announce: bool) -> AsyncIterator[TokenEvent]:
        events: asyncio.Queue[TokenEvent] = asyncio.Queue()
        loop = asyncio.get_running_loop()

        def deliver(event: TokenEvent) -> None:
            # A closed loop has no one left to listen: the engine must not fail for it.
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(events.put_nowait, event)

        self.submit(request, deliver, announce=announce)
        request_id, finished = request.request_id, False
        try:
            while not finished:
                event = await events.get()
                if announce and event.final:  # refused before it was taken in
                    yield TokenEvent(request_id, [], "")
                announce, finished = False, event.final
                yield event
        finally:
            if not finished:
                self.abort(request_id)

    def check(self, request: Request) -> None:
        """Refuse a request that could never run: empty, holding a token id the model has no
        embedding for (a tokenizer larger than the model: in a step it would fail every request
        beside it, or on MLX read past the table), or longer than a sequence can be."""
        ids = request.prompt_token_ids
        prompt_tokens = len(ids)
        if prompt_tokens == 0:
            raise InvalidRequest("the prompt is empty")
        vocab = self.model.config.vocab_size
        if min(ids) < 0 or max(ids) >= vocab:
            outside = next(token for token in ids if not 0 <= token < vocab)
            raise InvalidRequest(
                f"the prompt holds token id {outside}, outside the model's vocabulary "
                f"(0 to {vocab - 1}): its tokenizer is larger than the model"
            )
        if prompt_tokens < self.max_seq_tokens:
            return
        if self.max_seq_tokens == self.model.context_length:
            raise ContextOverflow(prompt_tokens, 0, self.model.context_length)
        raise PoolExhausted(
            f"the prompt has {prompt_tokens} tokens; the KV pool holds at most "
            f"{self.max_seq_tokens} for one sequence (raise cache_budget_mb)"
        )

    def submit(self, request: Request, sink: EventSink, *, announce: bool = False) -> None:
        with self._refusal_lock:
            refusal = self._refusal
            if refusal is None:
                self._inbox.put(_Submit(request, sink, announce))
                return
        sink(_refused(request, refusal))

    async def cancel_all(self, error: Exception) -> int:
        """Fail every request in flight with `error`, and every request submitted from now on:
        how a model swap or a shutdown ends the requests that outlast its drain. Returns how many
        it failed."""
        return await self.call(lambda: self._cancel_all(error))

    def abort(self, request_id: str) -> None:
        self._inbox.put(_Abort(request_id))

    async def call(self, function: Callable[[], T]) -> T:
        """Run `function` on the engine thread between steps and return its result (how the
        API reads or changes engine state: statistics, persist, agents)."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[T] = loop.create_future()

        def reply(result: Any, error: BaseException | None) -> None:
            loop.call_soon_threadsafe(_settle, future, result, error)

        with self._refusal_lock:
            if self._inbox_closed:
                raise Unavailable(_STOPPED)
            self._inbox.put(_Call(function, reply))
        return await future

    def post(self, function: Callable[[], object]) -> None:
        """Run `function` on the engine thread between steps, without waiting for it. Safe from
        any thread and from a finalizer, where nothing can be awaited (releasing a hold that
        must not outlive a cancelled request); an error is logged. Dropped once the engine has
        stopped. (No lock here: a finalizer may run while this thread holds it.)"""
        if not self._inbox_closed:
            self._inbox.put(_Call(function, _log_failure))

    async def persist(self, agents: list[AgentKey] | None = None) -> PersistResult:
        """Write hot caches to disk (these agents', or all) and return once durable. The
        engine thread only copies blocks out; the wait for fsync happens off it."""
        with self.metrics.cache_persist_duration.time():
            pending = await self.call(lambda: self.agents.start_persist(agents))
            return await asyncio.to_thread(pending.wait)

    async def evict(self, agents: list[AgentKey] | None = None) -> EvictResult:
        """Move caches out of memory (these agents', or all): persist them, then free the
        blocks that made it to disk and that no running request holds."""
        persisted = await self.persist(agents)
        evicted = await self.call(lambda: self.agents.evict(agents))
        return EvictResult(persisted, evicted)

    def progress(self, request_id: str) -> tuple[int, int] | None:
        """How far a request's prompt is prefilled: (tokens with KV, prompt tokens), for the
        heartbeat of a long prefill; None once it has left the engine (or not yet arrived)."""
        active = self._active.get(request_id)
        if active is None:
            return None
        seq = active.seq
        return min(seq.num_computed_tokens, seq.num_prompt_tokens), seq.num_prompt_tokens

    def stats(self) -> EngineStats:
        return EngineStats(
            running=len(self.scheduler.running) + len(self.scheduler.restoring),
            waiting=len(self.scheduler.waiting),
            blocks_total=self.pool.num_blocks,
            blocks_held=self.pool.num_held,
            blocks_cached=self.pool.num_cached,
            blocks_free=self.pool.num_free,
        )

    def state(self) -> dict[str, Any]:
        """The pool and the queue, as `/health/ready` and `/admin/cache` show them."""
        return asdict(self.stats())

    def cache_spec_tag(self) -> str | None:
        return self.runner.cache_spec.tag()

    async def reading(self) -> EngineReading:
        """The engine's state for a metrics scrape, read on the engine thread, which owns it;
        `Unavailable` while that thread does not run (nothing would answer the call)."""
        if not self.alive:
            raise Unavailable(self.down_reason)
        return read_engine(await self.call(self.snapshot))

    def snapshot(self) -> EngineSnapshot:
        """What the metrics read of the engine, taken on the engine thread, which owns it."""
        active, idle = self.agents.census()
        return EngineSnapshot(
            model=self.model.name,
            stats=self.stats(),
            bytes_per_page=self.runner.cache_spec.bytes_per_page,
            reclaimed=dict(enumerate(self.pool.reclaimed)),
            preemptions=self.scheduler.preemptions,
            agents_active=active,
            agents_idle=idle,
            cache=self.agents.stats.totals(),
        )

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    down_reason = "the engine thread is not running"

    # -- the engine thread -----------------------------------------------------------------

    def run_until_idle(self) -> None:
        """Step until every message is handled and nothing is left to do (without the thread)."""
        ran = self.step()
        while self.scheduler.has_work or not self._inbox.empty() or self.write_behind.pending:
            if not ran and self._inbox.empty():  # waiting on the disk reader, or for room
                self._wait_for_messages(timeout=IDLE_WAIT_S)
            ran = self.step()

    def step(self) -> bool:
        """One engine step: take messages, schedule, run, postprocess, publish, then copy
        finished turns out to be written behind. Returns whether it computed or copied
        anything."""
        self._handle_messages()
        self.agents.sweep()
        batch = self.scheduler.schedule()
        self._expire_waiting()  # after admission: one that waited long but fits now runs
        self._start_restores()
        ran = self._compute(batch)
        return self.write_behind.step() or ran

    def _compute(self, batch: Batch) -> bool:
        """Run `batch` and publish its tokens; whether there was anything to run."""
        if not batch:
            if self.scheduler.blocked_by_held_pages():
                self.agents.let_go_of_pins()
            return False
        tokens = self._run(batch)
        if tokens is None:
            return True
        logprobs = {
            item.seq_id: token
            for item, token in zip(batch.items, tokens, strict=True)
            if isinstance(token, TokenLogprob)
        }
        sampled = self.scheduler.update(batch, tokens)
        self.prefill_progress.stepped(self.scheduler.running)
        published = sum(
            self._publish_run(seq, run, logprobs.get(seq.seq_id)) for seq, run in sampled
        )
        self.metrics.stepped(batch, published, tokens)
        return True

    def _publish_run(
        self, seq: Sequence, run: list[int], logprob: TokenLogprob | None = None
    ) -> int:
        """Publish a sequence's new tokens in order (more than one: a verified draft's), until
        one ends it; returns how many it published. The scheduler appended the first; each
        later one is appended as it is published, so none after a stop is ever recorded.
        `logprob` is the first's, when its request asked (such a request never drafts)."""
        active = self._active[seq.request.request_id]
        self._publish(active, run[0], logprob)
        published = 1
        for token in run[1:]:
            if seq.status is not SequenceStatus.RUNNING:  # it ended: the rest are dropped
                break
            self.scheduler.accept(seq, token)
            self._publish(active, token)
            published += 1
        return published

    def _run(self, batch: Batch) -> list[StepToken] | None:
        """The runner's tokens for `batch`. An item it could not sample fails alone, before the
        step is recorded, so none of its KV from this step is cached; when the whole step
        fails, every request in it has failed and this returns None."""
        try:
            return list(self.runner.run(batch))
        except RowsFailed as exc:  # each failure is logged with its request as it ends
            for index, error in exc.errors.items():
                self._fail([batch.items[index].seq_id], error)
            return exc.tokens
        except Exception as exc:
            log.exception("the runner failed a step of %d sequences", len(batch.items))
            self._fail([item.seq_id for item in batch.items], exc)
            return None

    def _publish(self, active: _Active, token: int, logprob: TokenLogprob | None = None) -> None:
        """Hand a request its new token. A failure here (decoding, a stop check, its sink) is
        that request's alone."""
        try:
            self._on_token(active, token, logprob)
        except Exception as exc:
            log.exception("publishing a token of request %s failed", active.seq.request.request_id)
            if active.seq.request.request_id in self._active:
                self._fail([active.seq.seq_id], exc)
            else:  # it failed while finishing, after leaving the engine: still tell its client
                active.sink(_refused(active.seq.request, _failure(exc)))

    def _loop(self) -> None:
        ran = False
        while not self._stopping:
            try:
                if not self.scheduler.has_work and not self.write_behind.pending:
                    # Idle, it still wakes for the next retention's end: no expired one holds
                    # memory (the sweep runs at most once a second).
                    until = self.agents.retentions.next_expiry_in()
                    self._wait_for_messages(None if until is None else max(until, 1.0))
                elif not ran:  # waiting on the disk reader, or for room: sleep, don't spin
                    self._wait_for_messages(timeout=IDLE_WAIT_S)
                ran = self.step()
            except Exception as exc:  # a bug, not a runner failure: fail what is in flight
                log.exception("the engine loop failed; failing all requests in flight")
                self._fail([active.seq.seq_id for active in self._active.values()], exc)
        self._shut_down()

    def _shut_down(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._close_inbox()
        for request_id in list(self._active):
            self._abort(request_id)
        try:
            result = self.agents.persist(timeout=60)
            log.info(
                "persisted %d blocks (%d failed) and %d agents",
                result.blocks_written,
                result.failed,
                result.agents_saved,
            )
        finally:
            self.tiering.close(timeout=60)

    def _close_inbox(self) -> None:
        """Answer every message still queued and refuse every later one, so that no caller
        waits on a stopped engine."""
        with self._refusal_lock:
            self._inbox_closed = True
            self._refusal = self._refusal or Unavailable(_STOPPED)
        while True:
            try:
                message = self._inbox.get_nowait()
            except queue.Empty:
                return
            if isinstance(message, _Call):
                message.reply(None, Unavailable(_STOPPED))
            elif isinstance(message, _Submit):
                message.sink(_refused(message.request, self._refusal))

    def _wait_for_messages(self, timeout: float | None = None) -> None:
        """Sleep until a message comes (or `timeout` passes), then gather what else arrives
        within the batch window, so requests sent together start together."""
        try:
            self._handle(self._inbox.get(timeout=timeout))
        except queue.Empty:
            return
        window_end = time.monotonic() + self.options.batch_window_s
        while not self._stopping and (remaining := window_end - time.monotonic()) > 0:
            try:
                self._handle(self._inbox.get(timeout=remaining))
            except queue.Empty:
                return

    def _handle_messages(self) -> None:
        while not self._stopping:
            try:
                self._handle(self._inbox.get_nowait())
            except queue.Empty:
                return

    def _handle(self, message: _Message) -> None:
        if isinstance(message, _Stop):
            self._stopping = True
        elif isinstance(message, _Abort):
            self._abort(message.request_id)
        elif isinstance(message, _Restored):
            try:
                self._restored(message)
            except Exception as exc:  # a failed copy into the pool fails that request only
                log.exception("restoring request %s failed", message.seq.request.request_id)
                self._fail([message.seq.seq_id], exc)
        elif isinstance(message, _Call):
            try:
                message.reply(message.function(), None)
            except Exception as exc:
                message.reply(None, exc)
        else:
            try:
                self._admit(message)
            except Exception as exc:  # before it joined the scheduler: it alone fails
                if not isinstance(exc, SemanticError):  # ours (a limit) say what they are
                    log.exception("admitting request %s failed", message.request.request_id)
                self._active.pop(message.request.request_id, None)
                self.agents.not_admitted(message.request)
                message.sink(_refused(message.request, _failure(exc)))

    def _admit(self, message: _Submit) -> None:
        request, sink = message.request, message.sink
        if self._refusal is not None:  # queued just before `cancel_all`
            sink(_refused(request, self._refusal))
            return
        seq = Sequence(
            seq_id=next(self._seq_ids),
            request=request,
            token_ids=list(request.prompt_token_ids),
            num_prompt_tokens=len(request.prompt_token_ids),
        )
        self.agents.begin(request)
        detokenizer = IncrementalDetokenizer(self.model.tokenizer)
        stops = StopMatcher(request.sampling.stop)
        self._active[request.request_id] = _Active(seq, sink, detokenizer, stops)
        match = self.scheduler.add(seq)
        self.tiering.read_ahead(match.to_restore)
        seq.cache_miss = self.agents.why_missed(request, match, self.scheduler.blocks.root(seq))
        if message.announce:
            sink(TokenEvent(request.request_id, [], "", cache_miss=seq.cache_miss))

    def _start_restores(self) -> None:
        """Ask the disk reader for the blocks of the sequences admitted this step; the records
        come back through the inbox, so the engine keeps stepping meanwhile."""
        size = self.runner.cache_spec.block_tokens
        for seq in self.scheduler.take_restores():
            restore = seq.restore
            assert restore is not None
            wanted = []
            for key, index in zip(restore.keys, restore.indexes, strict=True):
                full = index < len(restore.block_hashes)
                end = index * size + (size if full else restore.tail_tokens)
                wanted.append((key, tuple(seq.token_ids[index * size : end])))

            def deliver(
                records: list[BlockRecord], seq: Sequence = seq, restore: Restore = restore
            ) -> None:
                self._inbox.put(_Restored(seq, restore, records))

            self.tiering.read(wanted, deliver)

    def _restored(self, message: _Restored) -> None:
        """Pages came back from disk: copy them into the sequence's pages and let it run.
        Dropped when the sequence ended (or was restored) meanwhile: its pages are not its own
        any more."""
        seq, restore = message.seq, message.restore
        if seq.status is not SequenceStatus.RESTORING or seq.restore is not restore:
            return
        for page, record in zip(restore.pages, message.records, strict=False):
            self.runner.write_block(page, record.kv)
        self.scheduler.restored(seq, len(message.records))

    def _on_token(self, active: _Active, token: int, logprob: TokenLogprob | None) -> None:
        seq, params = active.seq, active.seq.request.sampling
        logprobs = None if logprob is None else (logprob,)
        if seq.num_output_tokens == 1:
            seq.first_token_time = time.monotonic()
            self.metrics.first_token(seq.request)
        ends = token in params.stop_token_ids or (
            token in self.scheduler.end_token_ids and not params.ignore_eos
        )
        if ends and seq.num_output_tokens > params.min_tokens:
            rest = self._rest_of_text(active)
            self._finish(active, FinishReason.STOP, [token], rest, logprobs=logprobs)
            return
        text, stop_string = active.stops.feed(active.detokenizer.push(token))
        if stop_string is not None:
            self._finish(active, FinishReason.STOP, [token], text, stop_string, logprobs=logprobs)
        elif (
            seq.num_output_tokens >= params.max_tokens or len(seq.token_ids) >= self.max_seq_tokens
        ):
            text += self._rest_of_text(active)
            self._finish(active, FinishReason.LENGTH, [token], text, logprobs=logprobs)
        else:
            active.sink(TokenEvent(seq.request.request_id, [token], text, logprobs=logprobs))

    @staticmethod
    def _rest_of_text(active: _Active) -> str:
        """The text held back for lack of context (a partial character or stop string), when
        generation ends without a stop string."""
        text, stop_string = active.stops.feed(active.detokenizer.flush())
        return text if stop_string is not None else text + active.stops.flush()

    def _finish(
        self,
        active: _Active,
        reason: FinishReason,
        token_ids: list[int],
        text: str,
        stop_string: str | None = None,
        error: Exception | None = None,
        logprobs: tuple[TokenLogprob, ...] | None = None,
    ) -> None:
        seq = active.seq
        history = self.scheduler.finish(seq, reason)
        self.runner.forget(seq.seq_id)
        del self._active[seq.request.request_id]
        kept = self.agents.finished(
            seq.request,
            history,
            seq.num_cached_tokens,
            seq.num_disk_tokens,
            seq.missing_hash,
            answered=reason.answered,
            miss=seq.cache_miss,
        )
        retained = self.agents.retain(seq.request, history, seq.num_cached_tokens)
        usage = Usage(seq.num_prompt_tokens, seq.num_output_tokens, seq.num_cached_tokens, retained)
        event = TokenEvent(
            seq.request.request_id,
            token_ids,
            text,
            reason,
            usage,
            error,
            stop_string,
            logprobs=logprobs,
        )
        _log_finish(seq, reason, usage, error)  # logged before the client can see it
        active.sink(event)
        if kept is not None:
            self.write_behind.turn_ended(kept)  # copied after the step: never before the answer

    def _abort(self, request_id: str) -> None:
        active = self._active.get(request_id)
        if active is not None:
            self._finish(active, FinishReason.ABORT, [], "")

    def _cancel_all(self, error: Exception) -> int:
        with self._refusal_lock:
            self._refusal = error
        running = list(self._active.values())
        for active in running:
            # ABORT, not ERROR: nothing failed, so the partial last block is sound and stays
            # cached (and is persisted) like a disconnected client's.
            self._finish(active, FinishReason.ABORT, [], "", error=error)
        return len(running)

    def _fail(self, seq_ids: list[int], exc: Exception) -> None:
        error = _failure(exc)
        for active in [a for a in self._active.values() if a.seq.seq_id in seq_ids]:
            try:
                self._finish(active, FinishReason.ERROR, [], "", error=error)
            except Exception:  # the bookkeeping is broken too: still tell the client
                log.exception("ending request %s failed", active.seq.request.request_id)
                self._active.pop(active.seq.request.request_id, None)
                active.sink(_refused(active.seq.request, error))

    def _expire_waiting(self) -> None:
        """Refuse the sequences still waiting for room after `queue_timeout_s`, saying whether
        they never started or were preempted and not let back in."""
        timeout = self.options.queue_timeout_s
        for seq in self.scheduler.expired(timeout):
            if seq.first_scheduled_time is None:
                message = f"no room in the KV pool within {timeout:g} s; try again later"
            else:
                message = (
                    "preempted to make room for other requests and not resumed within "
                    f"{timeout:g} s; try again later"
                )
            error = Overloaded(message)
            self._finish(
                self._active[seq.request.request_id], FinishReason.ERROR, [], "", None, error
            )


_Message = _Submit | _Abort | _Stop | _Call | _Restored
# How long an engine with work it cannot do yet (a restore in flight, a full pool) sleeps
# before it looks again, unless a message wakes it first.
IDLE_WAIT_S = 0.05


def _log_finish(seq: Sequence, reason: FinishReason, usage: Usage, error: Exception | None) -> None:
    """One line per request, with its ids (contextvars do not reach this thread) and where its
    time went: to its first token (queue and prefill), and in all."""
    arrival = seq.request.arrival_time
    fields = request_fields(seq.request) | {
        "finish_reason": reason.value,
        "prompt_tokens": usage.prompt_tokens,
        "cached_tokens": usage.cached_tokens,
        "output_tokens": usage.completion_tokens,
        "first_token_s": None
        if seq.first_token_time is None
        else round(seq.first_token_time - arrival, 3),
        "seconds": round(time.monotonic() - arrival, 3),
    }
    if seq.cache_miss is not None:  # where and why its prompt missed what it could have had
        fields |= {
            "cache_miss_position": seq.cache_miss.position,
            "cache_miss_reason": seq.cache_miss.reason,
        }
    if error is not None:
        cause = f" ({error.__cause__!r})" if error.__cause__ is not None else ""
        log.warning("request failed: %s%s", error, cause, extra=fields)
    else:
        log.info("request finished", extra=fields)


def _failure(exc: Exception) -> SemanticError:
    """What a request's client learns of `exc`: an error of ours says what went wrong (a limit,
    an overload); any other is a fault whose text (paths, internals) stays in the log, where
    the caller put it and `_log_finish` names it with the request."""
    if isinstance(exc, SemanticError) and not isinstance(exc, RowsFailed):
        return exc
    failure = EngineFailure(ENGINE_FAILED)
    failure.__cause__ = exc
    return failure


ENGINE_FAILED = "the engine failed while running this request (the server log has the details)"


_STOPPED = "the engine has stopped"


def _refused(request: Request, error: Exception) -> TokenEvent:
    usage = Usage(len(request.prompt_token_ids), 0, 0)
    return TokenEvent(request.request_id, [], "", FinishReason.ERROR, usage, error)


def _log_failure(result: object, error: BaseException | None) -> None:
    if error is not None:
        log.error("a call posted to the engine failed", exc_info=error)


def _settle(future: asyncio.Future[Any], result: Any, error: BaseException | None) -> None:
    if future.done():  # the caller went away
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(result)
