"""The disk tier: atomic block files, checks and quarantine on read, eviction, writer, manifests."""

from __future__ import annotations

import errno
import json
import os
import threading
import zlib
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from safetensors import safe_open
from safetensors.numpy import load_file, save_file

from semantic.cache.agents.manifest import (
    AgentManifest,
    delete_manifest,
    list_manifests,
    load_manifest,
    manifest_path,
    save_manifest,
)
from semantic.cache.disk import durable
from semantic.cache.disk.tier import BlockRecord, DiskTier, model_tag
from semantic.cache.disk.writer import DiskWriter
from semantic.cache.pages.page import PageKV
from semantic.cache.pages.prefix import page_key
from semantic.core import AgentKey, CacheSpec
from semantic.errors import InvalidRequest

SPEC = CacheSpec(num_layers=2, num_kv_heads=1, head_dim=2, dtype="bfloat16", block_tokens=4)
SPEC32 = CacheSpec(num_layers=2, num_kv_heads=1, head_dim=2, dtype="float32", block_tokens=4)
SPEC8 = CacheSpec(2, 1, 2, "bfloat16", 4, kv_dtype="int8")
WEIGHTS = "0f" * 16  # a weights fingerprint
TAG = model_tag("tiny-model", SPEC, WEIGHTS)
KV_SHAPE = (2, 4, 1, 2)


def make_record(
    block_hash: int, spec: CacheSpec = SPEC, parent: int | None = None, n_tokens: int = 4
) -> BlockRecord:
    rng = np.random.default_rng(block_hash)
    k: np.ndarray
    v: np.ndarray
    tokens = tuple(int(t) for t in rng.integers(0, 50_000, n_tokens))
    if spec.kv_dtype == "int8":
        k, v = (rng.integers(-127, 128, KV_SHAPE, dtype=np.int8) for _ in range(2))
        scales = (rng.integers(0, 1 << 16, KV_SHAPE[:3], dtype=np.uint16) for _ in range(2))
        return BlockRecord(block_hash, parent, tokens, PageKV(k, v, *scales))
    if spec.dtype == "float32":
        k, v = (rng.standard_normal(KV_SHAPE).astype(np.float32) for _ in range(2))
    else:
        k, v = (rng.integers(0, 1 << 16, KV_SHAPE, dtype=np.uint16) for _ in range(2))
    return BlockRecord(key=block_hash, parent_hash=parent, token_ids=tokens, kv=PageKV(k, v))


def open_tier(
    root: Path, spec: CacheSpec = SPEC, tag: str = TAG, budget: int = 1 << 30
) -> DiskTier:
    return DiskTier(root, model_tag=tag, spec=spec, budget_bytes=budget)


def assert_same(got: BlockRecord | None, want: BlockRecord) -> None:
    assert got is not None
    assert (got.key, got.parent_hash, got.token_ids) == (
        want.key,
        want.parent_hash,
        want.token_ids,
    )
    got_arrays, want_arrays = got.kv.arrays(), want.kv.arrays()
    assert got_arrays.keys() == want_arrays.keys()
    for name, array in want_arrays.items():
        assert got_arrays[name].dtype == array.dtype and np.array_equal(got_arrays[name], array)


def temp_files(tier: DiskTier) -> list[Path]:
    return [p for p in tier.model_root.rglob("*") if p.name.endswith(".tmp")]


# -- round trip and atomic writes ----------------------------------------------------------------


def test_uint16_bits_round_trip_exactly_with_parent_and_tokens(tmp_path: Path) -> None:
    tier = open_tier(tmp_path)
    record = make_record(0xDEADBEEF, parent=0xFFFF_FFFF_FFFF_FFFF)
    assert tier.write(record) > 0
    assert_same(tier.read(record.key), record)
    path = tier.blocks_dir / f"{record.key:016x}.safetensors"
    with safe_open(str(path), framework="numpy") as f:
        meta = f.metadata()
    assert meta["dtype"] == "bfloat16" and meta["cache_spec"] == SPEC.tag()
    assert meta["model_tag"] == TAG and meta["format_version"] == "3"
    assert tier.stats.reads == 1 and tier.stats.writes == 1


def test_float32_partial_block_round_trips(tmp_path: Path) -> None:
    tier = open_tier(tmp_path, SPEC32)
    record = make_record(7, SPEC32, parent=None, n_tokens=2)
    tier.write(record)
    got = tier.read(7)
    assert_same(got, record)
    assert got is not None and len(got.token_ids) == 2 and got.parent_hash is None


# A hybrid geometry: a full-attention layer and a sliding one make two groups of one layer.
HYBRID = CacheSpec(2, 1, 2, "bfloat16", 4, layer_windows=(None, 6))


def test_a_later_groups_page_has_its_own_file_and_a_renamed_one_is_quarantined(
    tmp_path: Path,
) -> None:
    tag = model_tag("tiny-hybrid", HYBRID, WEIGHTS)
    tier = open_tier(tmp_path, HYBRID, tag)
    first, later = page_key(0xABC, 0), page_key(0xABC, 1)
    for key in (first, later):
        rng = np.random.default_rng(key % 1000)
        k, v = (rng.integers(0, 1 << 16, (1, 4, 1, 2), dtype=np.uint16) for _ in range(2))
        tier.write(BlockRecord(key, 5, (1, 2), PageKV(k, v)))
    names = sorted(p.name for p in tier.blocks_dir.iterdir())
    assert names == ["0000000000000abc-1.safetensors", "0000000000000abc.safetensors"]
    assert tier.tails(5) == [(0xABC, (1, 2))]  # a partial block, known by its first page
    reopened = open_tier(tmp_path, HYBRID, tag)
    assert reopened.contains(later) and reopened.tails(5) == [(0xABC, (1, 2))]
    got = reopened.read(later)
    assert got is not None and got.key == later and got.token_ids == (1, 2)
    os.rename(
        reopened.blocks_dir / "0000000000000abc-1.safetensors",
        reopened.blocks_dir / "0000000000000abc-2.safetensors",
    )
    moved = open_tier(tmp_path, HYBRID, tag)
    assert moved.read(page_key(0xABC, 2)) is None  # the file says group 1
    assert moved.stats.quarantined == {"corrupt": 1}


def test_write_is_temp_fsync_rename_then_dir_fsync_and_leaves_no_temp(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tier = open_tier(tmp_path)
    calls: list[str] = []
    real_fsync_file, real_fsync_dir, real_replace = durable._fsync, durable.fsync_dir, os.replace
    # Only this thread's calls: an engine an earlier test left running may still be writing.
    ours = threading.current_thread()

    def fsync_file(fd: int) -> None:
        if threading.current_thread() is ours:
            calls.append("fsync-file")
        real_fsync_file(fd)

    def fsync_dir(folder: Path) -> None:
        if threading.current_thread() is ours:
            calls.append("fsync-dir")
        real_fsync_dir(folder)

    def replace(src: str | Path, dst: str | Path) -> None:
        if threading.current_thread() is ours:
            assert Path(src).parent == Path(dst).parent and Path(src).name.endswith(".tmp")
            calls.append("rename")
        real_replace(src, dst)

    monkeypatch.setattr(durable, "_fsync", fsync_file)
    monkeypatch.setattr(durable, "fsync_dir", fsync_dir)
    monkeypatch.setattr(os, "replace", replace)
    tier.write(make_record(1))
    assert calls == ["fsync-file", "rename", "fsync-dir"]
    assert [p.name for p in tier.blocks_dir.iterdir()] == [f"{1:016x}.safetensors"]
    assert temp_files(tier) == []


def test_an_existing_block_is_not_rewritten(tmp_path: Path) -> None:
    tier = open_tier(tmp_path)
    record = make_record(3)
    first = tier.write(record)
    path = tier.blocks_dir / f"{3:016x}.safetensors"
    inode = path.stat().st_ino
    assert tier.write(record) == 0
    assert path.stat().st_ino == inode and tier.stats.writes == 1
    assert tier.usage_bytes() == first


def test_a_delete_that_lands_while_a_write_renames_leaves_no_file_the_index_names(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An agent deleted on the engine thread while the writer thread stores one of its pages:
    the delete comes right after the rename. The index must not then name a file that is gone:
    a page known to be on disk is never written again, so the next eviction of the same
    content would drop it, and a prompt would count it cached and then miss it."""
    tier = open_tier(tmp_path)
    renamed = durable.write_durably

    def rename_then_delete(path: Path, data: bytes) -> None:
        renamed(path, data)
        tier.delete(3)  # the engine thread, between the rename and the index

    monkeypatch.setattr("semantic.cache.disk.tier.write_durably", rename_then_delete)
    tier.write(make_record(3))
    path = tier.blocks_dir / f"{3:016x}.safetensors"
    assert tier.contains(3) == path.exists()
    monkeypatch.undo()
    tier.write(make_record(3))  # the same content evicted again: stored
    assert tier.contains(3) and path.exists()
    assert_same(tier.read(3), make_record(3))


def test_a_record_that_does_not_fit_the_spec_is_refused(tmp_path: Path) -> None:
    tier = open_tier(tmp_path)
    good = make_record(1)
    with pytest.raises(ValueError):
        wrong_dtype = PageKV(good.kv.k.astype(np.float32), good.kv.v)
        tier.write(BlockRecord(1, None, good.token_ids, wrong_dtype))
    with pytest.raises(ValueError):
        tier.write(BlockRecord(1, None, (1, 2, 3, 4, 5), good.kv))
    assert not tier.contains(1)


# -- bad files: quarantined, counted, never loaded -----------------------------------------------


def _rewrite(path: Path, meta: dict[str, str] | None = None, **tensors: np.ndarray) -> None:
    """Re-save a block file with some metadata or tensors replaced."""
    with safe_open(str(path), framework="numpy") as f:
        old_meta = f.metadata()
    saved = load_file(str(path))
    save_file({**saved, **tensors}, str(path), metadata={**old_meta, **(meta or {})})


def _truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def _empty(path: Path) -> None:
    path.write_bytes(b"")


def _garbage_header(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[8:20] = b"\xff" * 12
    path.write_bytes(bytes(data))


def _flip_kv_bit(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[-40] ^= 0x01  # inside the tensor data, which sits at the end
    path.write_bytes(bytes(data))


def _flip_parent(path: Path) -> None:
    _rewrite(path, {"parent_hash": f"{0x0BAD:016x}"})


def _other_version(path: Path) -> None:
    _rewrite(path, {"format_version": "1"})  # an older format


def _wrong_shape(path: Path) -> None:
    _rewrite(path, k=np.zeros((2, 4, 1, 3), dtype=np.uint16))


def _other_model(path: Path) -> None:
    other = open_tier(path.parent.parent.parent, tag=model_tag("other-model", SPEC, WEIGHTS))
    other.write(make_record(42, parent=1))
    path.write_bytes((other.blocks_dir / path.name).read_bytes())


def _other_spec(path: Path) -> None:
    spec = CacheSpec(num_layers=2, num_kv_heads=1, head_dim=2, dtype="float16", block_tokens=4)
    other = open_tier(path.parent.parent.parent / "elsewhere", spec=spec)
    other.write(make_record(42, parent=1))
    path.write_bytes((other.blocks_dir / path.name).read_bytes())


def _other_kv_dtype(path: Path) -> None:
    """The file of an 8-bit cache of the same model and geometry, under this cache's tag."""
    other = open_tier(path.parent.parent.parent / "elsewhere", spec=SPEC8)
    other.write(make_record(42, SPEC8, parent=1))
    path.write_bytes((other.blocks_dir / path.name).read_bytes())


@pytest.mark.parametrize(
    ("damage", "reason"),
    [
        (_truncate, "truncated"),
        (_empty, "truncated"),
        (_garbage_header, "corrupt"),
        (_flip_kv_bit, "checksum"),
        (_flip_parent, "checksum"),
        (_other_version, "version"),
        (_wrong_shape, "shape"),
        (_other_model, "other_model"),
        (_other_spec, "other_spec"),
        (_other_kv_dtype, "other_spec"),
    ],
)
def test_a_bad_file_is_a_miss_moved_to_quarantine_and_counted(
    tmp_path: Path, damage: Callable[[Path], None], reason: str
) -> None:
    tier = open_tier(tmp_path)
    tier.write(make_record(42, parent=1))
    tier.write(make_record(43, parent=42))
    path = tier.blocks_dir / f"{42:016x}.safetensors"
    damage(path)
    tier = open_tier(tmp_path)  # a restart: headers are checked as it opens, content on read
    assert tier.read(42) is None
    assert not path.exists() and not tier.contains(42)
    assert [p.name.split(".")[1] for p in tier.quarantine_dir.iterdir()] == [reason]
    stats = tier.stats
    assert stats.quarantined == {reason: 1} and stats.misses == 1 and stats.files == 1
    assert tier.read(42) is None and tier.stats.quarantined == {reason: 1}
    assert_same(tier.read(43), make_record(43, parent=42))  # its neighbour is untouched


def test_an_absent_block_is_a_counted_miss(tmp_path: Path) -> None:
    tier = open_tier(tmp_path)
    assert tier.read(99) is None
    assert tier.stats.misses == 1 and tier.stats.quarantined == {}


# -- the mark of a history that ended with a block -----------------------------------------------


def marked(record: BlockRecord) -> BlockRecord:
    return replace(record, ends_history=True)


def _version_2_file(tier: DiskTier, record: BlockRecord) -> None:
    """Save a page as format version 2 wrote it, with no history-end mark: built by hand, so
    the test pins that format rather than whatever the writer does now."""
    name, parent = f"{record.key:016x}", f"{record.parent_hash:016x}"
    arrays = {"k": record.kv.k, "v": record.kv.v}
    arrays["token_ids"] = np.asarray(record.token_ids, dtype=np.int32)
    crc = 0
    for array in arrays.values():  # k, v, token_ids: little-endian raw bytes
        crc = zlib.crc32(array.astype(array.dtype.newbyteorder("<")).tobytes(), crc)
    meta = {
        "format_version": "2",
        "block_hash": name,
        "parent_hash": parent,
        "model_tag": tier.model_tag,
        "cache_spec": SPEC.tag(),
        "dtype": SPEC.dtype,
        "checksum": f"{zlib.crc32(f'{name}:{parent}'.encode(), crc):08x}",
    }
    save_file(arrays, str(tier.blocks_dir / f"{name}.safetensors"), metadata=meta)


def _set_metadata(path: Path, **meta: str | None) -> None:
    """Re-save a block file with metadata set (None: removed)."""
    with safe_open(str(path), framework="numpy") as f:
        old_meta = f.metadata()
    new_meta = {k: v for k, v in {**old_meta, **meta}.items() if v is not None}
    save_file(load_file(str(path)), str(path), metadata=new_meta)


def test_a_history_end_mark_is_saved_with_its_page_and_known_after_a_restart(
    tmp_path: Path,
) -> None:
    tier = open_tier(tmp_path)
    tier.write(marked(make_record(5, parent=1)))
    tier.write(make_record(6, parent=5))
    tier.write(make_record(7, parent=6, n_tokens=2))  # a partial tail: still found by parent
    for opened in (tier, open_tier(tmp_path)):  # the second: a restart over the same folder
        assert opened.ends_history(5) and not opened.ends_history(6)
        assert opened.tails(6) == [(7, make_record(7, parent=6, n_tokens=2).token_ids)]
        got = opened.read(5)
        assert_same(got, make_record(5, parent=1))
        assert got is not None and got.ends_history
        unmarked = opened.read(6)
        assert unmarked is not None and not unmarked.ends_history


def test_a_version_2_file_still_loads_as_a_block_no_history_ended_with(tmp_path: Path) -> None:
    tier = open_tier(tmp_path)
    full, tail = make_record(8, parent=3), make_record(9, parent=8, n_tokens=3)
    _version_2_file(tier, full)
    _version_2_file(tier, tail)
    tier = open_tier(tmp_path)  # a restart indexes them
    assert tier.contains(8) and not tier.ends_history(8)
    assert tier.tails(8) == [(9, tail.token_ids)]
    for want in (full, tail):
        got = tier.read(want.key)
        assert_same(got, want)
        assert got is not None and not got.ends_history
    assert tier.stats.quarantined == {}


def test_a_page_on_disk_without_the_mark_is_written_once_more_to_add_it(tmp_path: Path) -> None:
    tier = open_tier(tmp_path)
    record = make_record(10, parent=2)
    tier.write(record)
    path = tier.blocks_dir / f"{10:016x}.safetensors"
    inode = path.stat().st_ino
    size = tier.write(marked(record))
    assert size > 0 and path.stat().st_ino != inode and tier.ends_history(10)
    assert tier.write(marked(record)) == 0 and tier.write(record) == 0  # never again
    assert tier.ends_history(10) and tier.stats.writes == 2
    assert tier.usage_bytes() == size == path.stat().st_size and temp_files(tier) == []
    got = open_tier(tmp_path).read(10)
    assert_same(got, record)
    assert got is not None and got.ends_history


def test_a_page_that_leaves_the_disk_takes_its_mark_along(tmp_path: Path) -> None:
    tier = open_tier(tmp_path)
    tier.write(marked(make_record(11)))
    assert tier.delete(11) and not tier.ends_history(11)
    tier.write(make_record(11))
    assert not tier.ends_history(11)


@pytest.mark.parametrize("history_end", [None, "0", "yes"])
def test_the_checksum_covers_the_mark(tmp_path: Path, history_end: str | None) -> None:
    tier = open_tier(tmp_path)
    tier.write(marked(make_record(12, parent=1)))
    tier.write(make_record(13, parent=1))
    _set_metadata(tier.blocks_dir / f"{12:016x}.safetensors", history_end=history_end)
    _set_metadata(tier.blocks_dir / f"{13:016x}.safetensors", history_end="1")
    tier = open_tier(tmp_path)
    assert tier.read(12) is None and tier.read(13) is None
    assert tier.stats.quarantined == {"checksum": 2}


# -- startup -------------------------------------------------------------------------------------


def test_startup_removes_temp_files_a_crash_left_and_indexes_by_name(tmp_path: Path) -> None:
    tier = open_tier(tmp_path)
    size = tier.write(make_record(5))
    half = (tier.blocks_dir / f"{5:016x}.safetensors").read_bytes()[:100]
    (tier.blocks_dir / f".{6:016x}.safetensors.0123abcd.tmp").write_bytes(half)  # mid-write
    (tier.model_root / "agents" / ".a1.json.0123abcd.tmp").write_bytes(b'{"agent')
    (tier.blocks_dir / "notes.txt").write_text("not a block")
    tier = open_tier(tmp_path)
    assert temp_files(tier) == []
    assert tier.contains(5) and not tier.contains(6)
    assert tier.usage_bytes() == size and tier.stats.files == 1
    assert (tier.blocks_dir / "notes.txt").exists()  # not ours: left alone


# -- disk full -----------------------------------------------------------------------------------


def _disk_fills_up(monkeypatch: pytest.MonkeyPatch) -> None:
    """os.write lands part of the first chunk, then the disk is full."""
    real_write = os.write

    def write(fd: int, data: bytes | memoryview) -> int:
        if len(data) > 64:
            real_write(fd, data[:64])
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "write", write)


def test_disk_full_leaves_no_file_and_raises(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tier = open_tier(tmp_path)
    _disk_fills_up(monkeypatch)
    with pytest.raises(OSError) as caught:
        tier.write(make_record(1))
    assert caught.value.errno == errno.ENOSPC
    assert list(tier.blocks_dir.iterdir()) == [] and not tier.contains(1)
    assert tier.stats.write_errors == 1
    monkeypatch.undo()
    tier.write(make_record(1))
    assert_same(tier.read(1), make_record(1))


def test_writer_reports_disk_full_and_keeps_writing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tier = open_tier(tmp_path)
    writer = DiskWriter(tier)
    results: dict[int, tuple[int, BaseException | None]] = {}

    def done(block_hash: int) -> Callable[[int, BaseException | None], None]:
        return lambda written, error: results.__setitem__(block_hash, (written, error))

    _disk_fills_up(monkeypatch)
    writer.submit(make_record(1), done(1))
    assert writer.flush(timeout=10)
    monkeypatch.undo()
    writer.submit(make_record(2), done(2))
    assert writer.flush(timeout=10)
    assert writer.close(timeout=10)
    error = results[1][1]
    assert isinstance(error, OSError) and error.errno == errno.ENOSPC
    assert results[2][0] > 0 and results[2][1] is None
    assert writer.failed == 1 and not tier.contains(1) and tier.contains(2)
    assert temp_files(tier) == []


# -- the writer ----------------------------------------------------------------------------------


def test_flush_returns_only_once_earlier_writes_are_fsynced(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tier = open_tier(tmp_path)
    writer = DiskWriter(tier)
    disk_may_sync = threading.Event()
    synced: list[str] = []
    real_fsync_file, real_fsync_dir = durable._fsync, durable.fsync_dir

    # Only the writer's calls: an engine an earlier test left running may still be writing.
    def slow_fsync_file(fd: int) -> None:
        ours = threading.current_thread() is writer._thread
        if ours:
            disk_may_sync.wait(timeout=10)
        real_fsync_file(fd)
        if ours:
            synced.append("file")

    def fsync_dir(folder: Path) -> None:
        real_fsync_dir(folder)
        if threading.current_thread() is writer._thread:
            synced.append("folder")

    monkeypatch.setattr(durable, "_fsync", slow_fsync_file)
    monkeypatch.setattr(durable, "fsync_dir", fsync_dir)
    acked: list[int] = []
    writer.submit(make_record(1), lambda written, error: acked.append(written))
    assert writer.flush(timeout=0.05) is False  # stuck in fsync: not durable yet
    assert acked == [] and writer.pending == 1
    disk_may_sync.set()
    assert writer.flush(timeout=10) is True
    assert synced == ["file", "folder"] and len(acked) == 1 and acked[0] > 0
    assert tier.contains(1) and writer.pending == 0
    writer.close()


def test_a_page_written_again_while_its_deletion_is_queued_survives_the_deletion(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Until a deletion queued behind the writes has run, the records queued before it count
    as gone (and their files as going); a record queued after it is seen, and outlives it."""
    tier = open_tier(tmp_path)
    writer = DiskWriter(tier)
    disk_free = threading.Event()
    real_write = DiskTier.write

    def held(self: DiskTier, record: BlockRecord) -> int:
        disk_free.wait(10)
        return real_write(self, record)

    def delete(keys: list[int]) -> None:
        for key in keys:
            tier.delete(key)

    monkeypatch.setattr(DiskTier, "write", held)
    old, new = make_record(7, parent=5), make_record(7, parent=5)  # a partial block: a tail
    writer.submit(old)
    writer.delete_behind([7], delete)
    assert writer.queued(7) is None and writer.deleting(7) and writer.queued_tails(5, 8) == []
    writer.submit(new)
    assert writer.queued(7) is new and writer.queued_tails(5, 8) == [(7, new.token_ids)]
    disk_free.set()
    assert writer.flush(timeout=10)
    assert tier.contains(7) and not writer.deleting(7) and writer.queued(7) is None
    writer.close()


def test_a_closed_writer_refuses_jobs_and_a_callback_error_does_not_stop_it(
    tmp_path: Path,
) -> None:
    tier = open_tier(tmp_path)
    writer = DiskWriter(tier)

    def broken(written: int, error: BaseException | None) -> None:
        raise RuntimeError("caller bug")

    writer.submit(make_record(1), broken)
    writer.submit(make_record(2))
    assert writer.close(timeout=10)
    assert tier.contains(1) and tier.contains(2)
    with pytest.raises(RuntimeError):
        writer.submit(make_record(3))


# -- eviction ------------------------------------------------------------------------------------


def test_eviction_drops_least_recently_used_first_and_spares_protected(tmp_path: Path) -> None:
    tier = open_tier(tmp_path)
    size = tier.write(make_record(1))
    for block_hash in (2, 3, 4):
        tier.write(make_record(block_hash))
    tier.read(1)  # now 2 is the oldest, 1 the newest
    tier.budget_bytes = 2 * size
    assert tier.evict_to_budget(protected={2}) == [3, 4]
    assert [h for h in (1, 2, 3, 4) if tier.contains(h)] == [1, 2]
    assert sorted(p.name[:16] for p in tier.blocks_dir.iterdir()) == [f"{1:016x}", f"{2:016x}"]
    assert tier.usage_bytes() == 2 * size and tier.stats.evicted == 2
    assert tier.evict_to_budget() == []


def test_eviction_order_survives_a_restart_through_mtimes(tmp_path: Path) -> None:
    tier = open_tier(tmp_path)
    size = tier.write(make_record(1))
    tier.write(make_record(2))
    tier.write(make_record(3))
    for block_hash, when in ((1, 3000), (2, 1000), (3, 2000)):
        os.utime(tier.blocks_dir / f"{block_hash:016x}.safetensors", (when, when))
    tier = open_tier(tmp_path, budget=size)
    assert tier.evict_to_budget() == [2, 3]


def test_everything_protected_means_nothing_is_evicted(tmp_path: Path) -> None:
    tier = open_tier(tmp_path, budget=0)
    tier.write(make_record(1))
    assert tier.evict_to_budget(protected=frozenset({1})) == [] and tier.contains(1)


# -- manifests and tags --------------------------------------------------------------------------


def _manifest(tier: DiskTier, agent_id: str = "agent-1") -> AgentManifest:
    return AgentManifest(
        agent_id=agent_id,
        model_tag=tier.model_tag,
        block_hashes=[1, 0xFFFF_FFFF_FFFF_FFFF],
        tail_hash=3,
        num_tokens=10,
    )


def test_manifests_round_trip_list_and_delete(tmp_path: Path) -> None:
    tier = open_tier(tmp_path)
    first, second = _manifest(tier, "agent-1"), _manifest(tier, "b.2_x")
    save_manifest(tier.model_root, first)
    save_manifest(tier.model_root, second)
    assert load_manifest(tier.model_root, AgentKey("agent-1")) == first
    assert list_manifests(tier.model_root) == [first, second]
    assert delete_manifest(tier.model_root, AgentKey("agent-1")) is True
    assert load_manifest(tier.model_root, AgentKey("agent-1")) is None
    assert delete_manifest(tier.model_root, AgentKey("agent-1")) is False
    assert temp_files(tier) == []


def test_a_manifest_keeps_the_blocks_its_agent_found_cached_and_an_older_one_found_none(
    tmp_path: Path,
) -> None:
    tier = open_tier(tmp_path)
    found = replace(_manifest(tier), found_blocks=1)
    save_manifest(tier.model_root, found)
    assert load_manifest(tier.model_root, found.key) == found
    assert found.computed == [0xFFFF_FFFF_FFFF_FFFF, 3]
    path = manifest_path(tier.model_root, found.key)
    older = {k: v for k, v in json.loads(path.read_bytes()).items() if k != "found_blocks"}
    path.write_text(json.dumps(older))
    assert load_manifest(tier.model_root, found.key) == replace(found, found_blocks=0)


@pytest.mark.parametrize("bad_id", ["../x", ".hidden", "a" * 200, "a/b", ""])
def test_manifests_refuse_ids_that_are_not_safe_names(tmp_path: Path, bad_id: str) -> None:
    tier = open_tier(tmp_path)
    with pytest.raises(InvalidRequest):
        save_manifest(tier.model_root, _manifest(tier, bad_id))
    with pytest.raises(InvalidRequest):
        load_manifest(tier.model_root, AgentKey(bad_id))
    with pytest.raises(InvalidRequest):
        delete_manifest(tier.model_root, AgentKey(bad_id))
    assert list(tmp_path.rglob("*.json")) == []


@pytest.mark.parametrize(
    "content", [b"{not json", b"[]", b'{"format_version": 1}', b'{"format_version": 9}']
)
def test_a_bad_manifest_is_quarantined_and_reads_as_none(tmp_path: Path, content: bytes) -> None:
    tier = open_tier(tmp_path)
    save_manifest(tier.model_root, _manifest(tier, "good"))
    path = manifest_path(tier.model_root, AgentKey("bad"))
    path.write_bytes(content)
    assert load_manifest(tier.model_root, AgentKey("bad")) is None
    assert not path.exists()
    assert [p.name.split(".")[0] for p in tier.quarantine_dir.iterdir()] == ["bad"]
    assert [m.agent_id for m in list_manifests(tier.model_root)] == ["good"]


def test_model_tags_are_safe_names_and_differ_by_model_weights_and_spec() -> None:
    tag = model_tag("/models/Llama 3:8b/../model.gguf", SPEC, WEIGHTS)
    assert "/" not in tag and " " not in tag and not tag.startswith(".")
    # sanitize alike, still differ
    assert model_tag("a/b", SPEC, WEIGHTS) != model_tag("a_b", SPEC, WEIGHTS)
    assert model_tag("m", SPEC, WEIGHTS) != model_tag("m", SPEC32, WEIGHTS)
    assert model_tag("m", SPEC, WEIGHTS) != model_tag("m", SPEC, "1e" * 16)  # other weights
    assert model_tag("m", SPEC, WEIGHTS) == model_tag("m", SPEC, WEIGHTS)
    with pytest.raises(ValueError):
        DiskTier(Path("/tmp"), model_tag="../escape", spec=SPEC, budget_bytes=0)


def test_submit_waits_while_the_queue_holds_its_bound_of_bytes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tier = open_tier(tmp_path)
    size = make_record(1).kv.k.nbytes * 2
    writer = DiskWriter(tier, max_queued_bytes=2 * size)
    disk_may_write = threading.Event()
    real_write = DiskTier.write

    def slow_write(self: DiskTier, record: BlockRecord) -> int:
        disk_may_write.wait(timeout=10)
        return real_write(self, record)

    monkeypatch.setattr(DiskTier, "write", slow_write)
    writer.submit(make_record(1))
    writer.submit(make_record(2))  # two records fill the queue
    third = threading.Thread(target=writer.submit, args=(make_record(3),))
    third.start()
    third.join(timeout=0.2)
    assert third.is_alive() and writer.pending == 2  # held back, not queued
    disk_may_write.set()
    third.join(timeout=10)
    assert not third.is_alive() and writer.flush(timeout=10)
    assert all(tier.contains(h) for h in (1, 2, 3))
    writer.close()


def test_an_int8_page_round_trips_with_its_scales_in_about_half_a_bf16_file(
    tmp_path: Path,
) -> None:
    spec8 = CacheSpec(2, 3, 64, "bfloat16", 256, kv_dtype="int8")
    spec16 = CacheSpec(2, 3, 64, "bfloat16", 256)
    sizes = {}
    for spec in (spec8, spec16):
        tier = open_tier(tmp_path / spec.tag(), spec, model_tag("m", spec, WEIGHTS))
        rng = np.random.default_rng(7)
        shape = (2, 256, 3, 64)
        if spec.kv_dtype:
            kv = PageKV(
                *(rng.integers(-127, 128, shape, dtype=np.int8) for _ in range(2)),
                *(rng.integers(0, 1 << 16, shape[:3], dtype=np.uint16) for _ in range(2)),
            )
        else:
            kv = PageKV(*(rng.integers(0, 1 << 16, shape, dtype=np.uint16) for _ in range(2)))
        record = BlockRecord(9, 3, tuple(range(256)), kv)
        sizes[spec.kv_dtype] = tier.write(record)
        assert_same(open_tier(tmp_path / spec.tag(), spec, tier.model_tag).read(9), record)
    assert sizes["int8"] < 0.53 * sizes[None]  # 66 bytes a row against 128, and the header


def test_an_int8_cache_takes_no_bf16_file_and_a_bf16_cache_no_int8_file(tmp_path: Path) -> None:
    """Each under the other's folder, its name and metadata as written: refused as another
    spec, never read as the other layout."""
    tier8 = open_tier(tmp_path / "a", SPEC8)
    tier16 = open_tier(tmp_path / "b", SPEC)
    tier8.write(make_record(42, SPEC8, parent=1))
    tier16.write(make_record(43, SPEC, parent=1))
    for source, target, key in ((tier8, tier16, 42), (tier16, tier8, 43)):
        name = f"{key:016x}.safetensors"
        (target.blocks_dir / name).write_bytes((source.blocks_dir / name).read_bytes())
        reopened = open_tier(target.model_root.parent, target.spec)
        assert reopened.read(key) is None
        assert reopened.stats.quarantined == {"other_spec": 1}


def test_an_int8_record_without_scales_is_refused(tmp_path: Path) -> None:
    tier = open_tier(tmp_path, SPEC8)
    good = make_record(1, SPEC8)
    with pytest.raises(ValueError, match="holds"):
        tier.write(BlockRecord(1, None, good.token_ids, PageKV(good.kv.k, good.kv.v)))
    assert not tier.contains(1)
