"""The disk writer: block writes on a background thread, so the engine never waits on disk."""

from __future__ import annotations

import functools
import logging
import queue
import threading
from collections.abc import Callable, Sequence

from semantic.cache.disk.tier import BlockRecord, DiskTier, page_name
from semantic.cache.pages.prefix import split_key

log = logging.getLogger(__name__)

WriteCallback = Callable[[int, BaseException | None], None]
# A write and its callback, or a function to run once every earlier job has ended.
_Job = tuple[int, BlockRecord | Callable[[], None], WriteCallback | None]

# Blocks copied out of the pool and waiting for the disk. Without a bound, persisting a whole pool
# (shutdown, a swap, /admin/cache/persist) held a second copy of it in memory: +360 MiB at the
# end of a soak with the default 512 MiB pool, the size of the pool itself on a GPU.
MAX_QUEUED_BYTES = 128 * 2**20


class DiskWriter:
    """Runs block writes on one background thread, so the engine thread never waits on disk.

    Jobs run in submission order, so `flush` waits for the sequence number of the last job
    submitted before it. A failed job (ENOSPC, EIO, a bad record) is reported through its
    callback and counted; it never stops the thread, and later jobs still run. Callbacks run on
    the writer thread before their job counts as done: once `flush` returns True, every earlier
    job is durable or has reported its failure (`after` runs a function at that point). Records
    must own their arrays (copied out of the pool), since the pool may reuse the block before
    the write runs. `submit` waits while more
    than `max_queued_bytes` of records are queued: a disk slower than the copies holds back
    whoever copies (the engine thread), rather than filling memory. Until its write ends, a
    queued record can be read back (`queued`): a block evicted a moment ago is not a miss. A
    deletion queued behind the writes (`delete_behind`) makes its pages' earlier records and
    files count as gone at once (`queued`, `deleting`), so a page written again meanwhile is
    queued behind the deletion rather than skipped as there already.
    """

    def __init__(self, tier: DiskTier, max_queued_bytes: int = MAX_QUEUED_BYTES) -> None:
        self._tier = tier
        self._max = max_queued_bytes
        self._queued_bytes = 0
        self._jobs: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._cond = threading.Condition()
        self._submitted = 0
        self._done = 0
        self._failed = 0
        self._closed = False
        # The newest record queued for each page key, with its job's sequence number.
        self._queued: dict[int, tuple[int, BlockRecord]] = {}
        # Page keys with a deletion queued (`delete_behind`), and that job's sequence number.
        self._deleting: dict[int, int] = {}
        self._thread = threading.Thread(target=self._run, name="semantic-disk-writer", daemon=True)
        self._thread.start()

    @property
    def pending(self) -> int:
        with self._cond:
            return self._submitted - self._done

    @property
    def queued_bytes(self) -> int:
        """Bytes of the records queued and not yet written."""
        with self._cond:
            return self._queued_bytes

    @property
    def failed(self) -> int:
        with self._cond:
            return self._failed

    def queued(self, key: int) -> BlockRecord | None:
        """The record of a page whose write has not ended yet, if one is queued (and not
        before a deletion of the page that is queued too: that record is as good as gone)."""
        with self._cond:
            return self._live(key)

    def deleting(self, key: int) -> bool:
        """Whether a deletion of the page is queued and has not run yet: its file, if there is
        one, is on its way out."""
        with self._cond:
            return key in self._deleting

    def queued_tails(self, parent: int, block_tokens: int) -> list[tuple[int, tuple[int, ...]]]:
        """(hash, token ids) of the queued partial blocks that continue `parent`, known by
        their first group's page (as on disk)."""
        with self._cond:
            return [
                (r.key, r.token_ids)
                for r in map(self._live, list(self._queued))
                if r is not None
                and r.parent_hash == parent
                and len(r.token_ids) < block_tokens
                and split_key(r.key)[1] == 0
            ]

    def _live(self, key: int) -> BlockRecord | None:
        """`queued`, under the lock."""
        entry = self._queued.get(key)
        if entry is None or entry[0] < self._deleting.get(key, 0):
            return None
        return entry[1]

    def submit(self, record: BlockRecord, on_done: WriteCallback | None = None) -> None:
        """Queue a write; `on_done(bytes_written, error)` runs on the writer thread after it.
        Waits first while the queue is full (never on the writer thread: callbacks don't submit)."""
        size = _size(record)
        with self._cond:
            if self._closed:
                raise RuntimeError("the disk writer is closed")
            # A record larger than the bound goes when the queue is empty.
            self._cond.wait_for(
                lambda: self._queued_bytes + size <= self._max or not self._queued_bytes
            )
            self._queued_bytes += size
            self._submitted += 1
            self._queued[record.key] = (self._submitted, record)
            self._jobs.put((self._submitted, record, on_done))

    def after(self, function: Callable[[], None]) -> None:
        """Run `function` on the writer thread once every job submitted before it has ended:
        how a file that names blocks is written after them (`cache/agents/write_behind.py`)."""
        self._queue_call(lambda seq: function())

    def delete_behind(self, keys: list[int], delete: Callable[[list[int]], None]) -> None:
        """Run `delete(keys)` on the writer thread once every job submitted before it has
        ended (so it deletes again what a write queued earlier lands after a first deletion).
        Until it has run, those pages' earlier records and files count as gone: `queued`
        ignores the records, `deleting` says the files are going. A page written again
        meanwhile is queued after the deletion, and stays."""

        def run(seq: int) -> None:
            try:
                delete(keys)
            finally:
                with self._cond:
                    for key in keys:
                        if self._deleting.get(key) == seq:
                            del self._deleting[key]

        self._queue_call(run, keys)

    def _queue_call(self, function: Callable[[int], None], deleting: Sequence[int] = ()) -> None:
        """Queue `function(seq)`, `seq` its sequence number, to run after every earlier job;
        the pages `deleting` count as being deleted by it from now on."""
        with self._cond:
            if self._closed:
                raise RuntimeError("the disk writer is closed")
            self._submitted += 1
            seq = self._submitted
            for key in deleting:
                self._deleting[key] = seq
            self._jobs.put((seq, functools.partial(function, seq), None))

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until every job submitted before this call has finished (durable, or failed and
        reported). False when `timeout` seconds pass first."""
        with self._cond:
            target = self._submitted
            return self._cond.wait_for(lambda: self._done >= target, timeout)

    def close(self, timeout: float | None = None) -> bool:
        """Finish the queued jobs and stop the thread; True when it stopped within `timeout`."""
        with self._cond:
            if not self._closed:
                self._closed = True
                self._jobs.put(None)
        self._thread.join(timeout)
        return not self._thread.is_alive()

    def _run(self) -> None:
        while (job := self._jobs.get()) is not None:
            seq, work, on_done = job
            if not isinstance(work, BlockRecord):
                _call_quietly(work)
                with self._cond:
                    self._done = seq
                    self._cond.notify_all()
                continue
            written, error = self._write(work)
            if on_done is not None:
                _call_quietly(on_done, written, error)
            with self._cond:
                self._done = seq
                self._failed += error is not None
                self._queued_bytes -= _size(work)
                if self._queued.get(work.key, (0, None))[1] is work:
                    del self._queued[work.key]
                self._cond.notify_all()

    def _write(self, record: BlockRecord) -> tuple[int, BaseException | None]:
        try:
            return self._tier.write(record), None
        except Exception as exc:  # a failed write must not kill the writer: report it
            log.warning("cache page %s not written: %s", page_name(record.key), exc)
            return 0, exc


def _size(record: BlockRecord) -> int:
    return sum(array.nbytes for array in record.kv.arrays().values())


def _call_quietly(function: Callable[..., None], *args: object) -> None:
    try:
        function(*args)
    except Exception:  # a caller's bug must not stop every later write
        log.exception("a disk writer callback failed")
