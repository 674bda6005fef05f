"""The disk side of the KV cache: blocks the pool lets go are written to disk, blocks a prompt
needs are read back, hot blocks are persisted on request, and the disk keeps to its budget.

Threads: `save_evicted` and `start_persist` run on the engine thread, since they copy blocks out
of the pool; the writes run on the writer thread (`cache/disk/writer.py`) and the reads on the
reader thread, which hands its records back through the callback it is given. Counters are
guarded by `Tiering.lock`, since all three threads update them.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable
from collections.abc import Set as AbstractSet
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace

from semantic.cache.disk.tier import BlockRecord, DiskTier
from semantic.cache.disk.writer import DiskWriter, WriteCallback
from semantic.cache.pages.page import PageKV
from semantic.cache.pages.prefix import page_key, split_key

log = logging.getLogger(__name__)

# One page to persist: (pool page, page key, parent hash, token ids, whether it carries its
# block's history-end mark: `cache/pages/prefix.py: PrefixCache.marks_history_end`).
HotBlock = tuple[int, int, int, tuple[int, ...], bool]
# One page to restore: its key and the token ids it must hold (a prefix, for a partial one).
Wanted = tuple[int, tuple[int, ...]]
# A host copy of one pool page (the runner's `read_block`): what a write takes from the pool.
ReadPage = Callable[[int], PageKV]


@dataclass(slots=True)
class DiskTraffic:
    """Block counts since start, in the shape Prometheus counters want."""

    evicted_to_disk: int = 0  # written because the pool reclaimed them
    restored: int = 0  # read back into the pool for a prompt
    evicted_from_disk: int = 0  # dropped by the disk budget (gone)
    persisted: int = 0  # written by an explicit persist or at shutdown
    written_behind: int = 0  # written behind a named agent's turn (`cache/agents/write_behind.py`)
    write_behind_dropped: int = 0  # turns not written behind: too many waiting, or too large
    evicted_on_request: int = 0  # dropped from memory by `evict` (on disk already)
    write_errors: int = 0


@dataclass(slots=True)
class PendingWrites:
    """Writes queued by `Tiering.start_persist`; `wait` returns once they are durable or have
    failed, with the hashes of the blocks a page of which failed."""

    tiering: Tiering
    submitted: int = 0
    failed: set[int] = field(default_factory=set)  # filled by the writer thread

    def wait(self, timeout: float | None = None) -> bool:
        """True once every write ended (see `failed`); False when `timeout` passed first."""
        if not self.tiering.writer.flush(timeout):
            return False
        with self.tiering.lock:
            self.tiering.traffic.persisted += self.submitted - len(self.failed)
        return True


class Tiering:
    """The pool's lower tier (`cache/pages/prefix.py: LowerTier`): the disk, and the writes on
    their way to it, which count as there — a page evicted a moment ago is read back from its
    queued copy, never recomputed. Pages are known by their page keys (a block's hash and layer
    group).

    A page goes to disk when the pool reclaims it (unless the disk has it: content-addressed
    files are never rewritten; nor a page out of its window, which nothing reads), on persist,
    and at shutdown. The mark of a history that ended with a block goes with its first page,
    and is added to the file of one the disk has already (`end_history`). The disk budget drops
    least recently used files first, never those of `protected` block hashes (pinned agents').
    """

    def __init__(self, disk: DiskTier, read_page: ReadPage) -> None:
        self.disk = disk
        self.read_page = read_page
        self.writer = DiskWriter(disk)
        self.traffic = DiskTraffic()
        self.lock = threading.Lock()
        self.protected: AbstractSet[int] = frozenset()  # replaced whole, read by the writer
        self._reader = ThreadPoolExecutor(max_workers=1, thread_name_prefix="semantic-disk-reader")

    # -- what it holds ----------------------------------------------------------------------

    def contains(self, key: int) -> bool:
        return self.writer.queued(key) is not None or self.on_disk(key)

    def on_disk(self, key: int) -> bool:
        """Whether the disk has the page written, and no deletion of it is queued."""
        return not self.writer.deleting(key) and self.disk.contains(key)

    def tails(self, parent: int) -> list[tuple[int, tuple[int, ...]]]:
        queued = self.writer.queued_tails(parent, self.disk.spec.block_tokens)
        on_disk = [(h, t) for h, t in self.disk.tails(parent) if not self.writer.deleting(h)]
        return [*on_disk, *queued]

    def why_gone(self, key: int) -> str | None:
        return self.disk.why_gone(key)

    def ends_history(self, block_hash: int) -> bool:
        key = page_key(block_hash, 0)
        queued = self.writer.queued(key)
        if queued is not None and queued.ends_history:
            return True
        return not self.writer.deleting(key) and self.disk.ends_history(key)

    def end_history(self, block_hash: int) -> None:
        """A history ended with a block whose first page is here: mark its file, read back
        and written again with the mark (on the reader, then the writer thread)."""
        if not self.ends_history(block_hash):
            self._reader.submit(self._mark_history_end, page_key(block_hash, 0))

    def _mark_history_end(self, key: int) -> None:
        record = self._record(key)
        if record is not None and not record.ends_history:
            self.writer.submit(replace(record, ends_history=True))

    def holds(self, key: int, ends_history: bool) -> bool:
        """Whether a page is here, with its mark when it has one."""
        return self.contains(key) and (not ends_history or self.ends_history(split_key(key)[0]))

    # -- down: eviction and persistence (on the engine thread) ------------------------------

    def save_evicted(
        self, page: int, key: int, parent: int, tokens: tuple[int, ...], ends_history: bool
    ) -> None:
        """The pool is reclaiming a cached page: write it to disk first, unless it is there
        (with its mark)."""
        if self.holds(key, ends_history):
            return
        self._submit((page, key, parent, tokens, ends_history), self._evicted_written)

    def start_persist(self, blocks: Iterable[HotBlock]) -> PendingWrites:
        """Queue writes of the hot pages the disk lacks; `PendingWrites.wait` then waits for
        durability on any thread."""
        pending = PendingWrites(self)
        for hot in blocks:
            if self.on_disk(hot[1]) and (not hot[4] or self.disk.ends_history(hot[1])):
                continue

            def done(size: int, error: BaseException | None, key: int = hot[1]) -> None:
                if error is not None:
                    self._count_write_error()
                    pending.failed.add(split_key(key)[0])

            self._submit(hot, done)
            pending.submitted += 1
        return pending

    def write_behind(self, hot: HotBlock, done: WriteCallback) -> None:
        """Queue the write of a page a turn left (`cache/agents/write_behind.py`); `done` runs
        on the writer thread once it is durable or failed."""

        def written(size: int, error: BaseException | None) -> None:
            if error is not None:
                self._count_write_error()
            else:
                with self.lock:
                    self.traffic.written_behind += 1
                self.enforce_budget()
            done(size, error)

        self._submit(hot, written)

    def _submit(self, hot: HotBlock, done: WriteCallback) -> None:
        page, key, parent, tokens, ends_history = hot
        kv = self.read_page(page)
        self.writer.submit(BlockRecord(key, parent, tokens, kv, ends_history), done)

    def _evicted_written(self, size: int, error: BaseException | None) -> None:
        """On the writer thread, once an evicted block is durable (or failed)."""
        if error is not None:
            self._count_write_error()
            return
        with self.lock:
            self.traffic.evicted_to_disk += 1
        self.enforce_budget()

    def _count_write_error(self) -> None:
        with self.lock:
            self.traffic.write_errors += 1

    def enforce_budget(self) -> None:
        if self.disk.excess_bytes() > 0:
            dropped = self.disk.evict_to_budget(self.protected)
            with self.lock:
                self.traffic.evicted_from_disk += len(dropped)

    def delete(self, keys: Iterable[int]) -> None:
        """Delete pages from the disk (a deleted agent's)."""
        for key in keys:
            self.disk.delete(key)

    def delete_behind(self, keys: list[int]) -> None:
        """Delete pages from the disk now, and again once every write queued before now has
        ended (one may land after the first deletion). Meanwhile they count as gone, their
        queued copies too: the same content computed again (content-addressed, its keys are
        the same) is written again behind the second deletion, never skipped as there already
        and then deleted under the history that computed it again."""
        self.delete(keys)
        self.writer.delete_behind(keys, self.delete)

    def count_write_behind_dropped(self) -> None:
        with self.lock:
            self.traffic.write_behind_dropped += 1

    def count_evicted_on_request(self, blocks: int) -> None:
        with self.lock:
            self.traffic.evicted_on_request += blocks

    # -- up: restores -----------------------------------------------------------------------

    def read_ahead(self, keys: list[int]) -> None:
        """A request that will restore these pages has arrived: have the OS read their files
        while it waits for room (on the reader thread, behind any restore in progress)."""
        for key in keys:
            self._reader.submit(self.disk.read_ahead, key)

    def read(self, wanted: list[Wanted], deliver: Callable[[list[BlockRecord]], None]) -> None:
        """Read pages on the reader thread, in order, and hand `deliver` those before the first
        that is gone, fails its checks (it is quarantined) or does not hold the tokens wanted.
        `deliver` runs on the reader thread."""
        self._reader.submit(self._read, wanted, deliver)

    def _read(self, wanted: list[Wanted], deliver: Callable[[list[BlockRecord]], None]) -> None:
        records: list[BlockRecord] = []
        try:
            for key, tokens in wanted:
                record = self._record(key)
                if record is None or record.token_ids[: len(tokens)] != tokens:
                    break
                records.append(record)
        except Exception:  # a read must always answer, or its sequence would wait forever
            log.exception("reading cache blocks failed; the rest of the prompt is recomputed")
        with self.lock:
            self.traffic.restored += len(records)
        deliver(records)

    def reads_done(self, timeout: float | None = None) -> None:
        """Wait until every read queued so far has ended (restores delivered, history-end marks
        handed to the writer), so that a caller stepping the engine itself (a seeded test) sees
        them land at the same step however fast this thread runs."""
        self._reader.submit(lambda: None).result(timeout)

    def _record(self, key: int) -> BlockRecord | None:
        """A page's record, queued or read from disk; None when it is neither, or going."""
        queued = self.writer.queued(key)
        if queued is not None or self.writer.deleting(key):
            return queued
        return self.disk.read(key)

    def close(self, timeout: float | None = None) -> None:
        self._reader.shutdown(wait=True, cancel_futures=False)
        self.writer.close(timeout)
