"""The disk tier of the KV cache: content-addressed safetensors files, one per page (a layer
group's K/V of one block), named by page key.

Owns the layout under `<cache_dir>/<model_tag>/` (`blocks/`, `quarantine/`; manifests live in
`cache/agents/manifest.py`), the checks every file takes (its name, size and header when the
tier opens, `cache/disk/block_header.py`; all of it on read), quarantine of bad files and LRU
eviction to a byte budget. Backend-neutral: KV arrives as numpy (bf16/fp16 as `np.uint16` raw
bits), and nothing is ever unpickled. A file holds the page's arrays as the pool stores them
(`cache/pages/page.py`): an 8-bit cache's int8 K/V and their scales, about half a bf16 file.
Writes are atomic (`cache/disk/durable.py`) and run on the writer thread (`cache/disk/writer.py`).
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import re
import threading
import zlib
from collections.abc import Callable
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
from safetensors import SafetensorError
from safetensors.numpy import load as load_tensors
from safetensors.numpy import save as save_tensors

from semantic.cache.disk.block_header import (
    MAX_HEADER_BYTES,
    BlockHeader,
    TensorEntry,
    header_of,
    read_header,
)
from semantic.cache.disk.durable import (
    HEX_HASH,
    QuarantineReason,
    Rejected,
    move_to_quarantine,
    parse_hash,
    remove_temp_files,
    write_durably,
)
from semantic.cache.disk.index import GONE_CORRUPT, GONE_EVICTED, DiskIndex
from semantic.cache.disk.private_folder import check_private, private_folder
from semantic.cache.pages.page import SCALE_NAMES, PageKV, page_layout
from semantic.cache.pages.prefix import page_key, split_key
from semantic.core import CacheSpec

log = logging.getLogger(__name__)

# Block files; a different value is quarantined, never guessed at. 2: CRC-32 checksums (1 had
# blake2b, which took three quarters of a block's read). An 8-bit cache's files are version 2
# too: an unquantized file's layout is unchanged, and a quantized one is told apart by its
# spec tag and `kv_dtype` metadata (absent: K/V in `dtype`), so neither reads as the other.
# 3: a block's first page may say that a history ended with the block (`history_end`, under
# the checksum); a version 2 file, which never says so, still reads, as a block where none did.
FORMAT_VERSION = "3"
READABLE_VERSIONS = ("2", FORMAT_VERSION)
_HISTORY_END = "history_end"
BLOCK_SUFFIX = ".safetensors"
_MAX_GROUPS = 1 << 16
_SAFE_TAG = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9._-]*")
_GROUP = re.compile(r"[1-9][0-9]{0,4}")


def cache_root(cache_dir: Path) -> Path:
    """Where the KV cache lives under the cache directory."""
    return cache_dir / "kv"


def block_path(model_root: Path, key: int) -> Path:
    """The file of the page `key` in the cache of the model rooted at `model_root`:
    `<block hash, 16 hex digits>.safetensors` for a block's first layer group (the only one when
    all layers are alike), `<block hash>-<group>.safetensors` for the others."""
    return model_root / "blocks" / f"{page_name(key)}{BLOCK_SUFFIX}"


def block_files(model_root: Path, block_hash: int) -> list[Path]:
    """The files of a block's pages, every layer group's, that are under `model_root` (for
    tools that read a cache folder without knowing its geometry)."""
    first = block_path(model_root, block_hash)
    others = sorted(first.parent.glob(f"{block_hash:016x}-*{BLOCK_SUFFIX}"))
    return [path for path in (first, *others) if path.is_file()]


def page_name(key: int) -> str:
    """A page's name: its block hash (16 hex digits), then `-<group>` past the first group."""
    block_hash, group = split_key(key)
    if key < 0 or group >= _MAX_GROUPS:
        raise ValueError(f"page key {key} names no block and group")
    return f"{block_hash:016x}" if group == 0 else f"{block_hash:016x}-{group}"


def model_tag(model_id: str, spec: CacheSpec, weights: str) -> str:
    """The folder name for one model, its weights (their fingerprint) and cache geometry:
    readable, filesystem-safe, and unique, because a digest of the exact id, weights and spec
    separates ids that sanitize alike and weights served under one name."""
    readable = re.sub(r"[^A-Za-z0-9._-]+", "_", model_id).strip("._-")[-48:].lstrip("._-")
    named = f"{model_id}\0{weights}\0{spec.tag()}".encode()
    digest = hashlib.blake2b(named, digest_size=6).hexdigest()
    return f"{readable or 'model'}-{spec.tag()}-{digest}"


@dataclass(slots=True, frozen=True)
class BlockRecord:
    """One page's content: K and V of its layer group's layers (`cache/pages/page.py: PageKV`), and
    the `token_ids` its block holds (fewer than `block_tokens` for a partial tail). `key` is the
    page key (`cache/pages/prefix.py: page_key`: the block's hash, with the group above it).
    `ends_history`: a history ended exactly with this full block (set on its first group's
    page: `cache/pages/prefix.py: PrefixCache.end_history`)."""

    key: int
    parent_hash: int | None
    token_ids: tuple[int, ...]
    kv: PageKV
    ends_history: bool = False


@dataclass(slots=True)
class DiskStats:
    """Counters since the tier opened; `files` and `bytes` describe `blocks/` now.
    `reads` counts records returned, `misses` reads that returned None (absent or quarantined)."""

    files: int = 0
    bytes: int = 0
    writes: int = 0
    reads: int = 0
    misses: int = 0
    write_errors: int = 0
    read_errors: int = 0
    evicted: int = 0
    quarantined: dict[str, int] = field(default_factory=dict)  # by QuarantineReason


class DiskTier:
    """One model's KV pages on disk, addressed by page key (for a model whose layers are all
    alike: by block hash).

    Invariants: a file under its final name is complete — it was written under a temp name,
    fsynced and renamed — so a crash leaves the whole page or nothing; an existing page is never
    rewritten (same key, same content), but to add the mark of a history that ended with its
    block, once (the same atomic write). The index (`cache/disk/index.py`: sizes least recently
    used first, partial tails by parent, known by their first group's page) mirrors `blocks/`.
    A file is indexed only after its name, size and header pass their checks, and its content
    trusted only after all its checks pass on read; a file that fails either is moved to
    `quarantine/` and counted, never loaded, and the tier opens without it. The folders are
    this user's alone (`cache/disk/private_folder.py`): FolderNotPrivate otherwise.
    Thread-safe: the writer thread writes while the reader thread reads and the engine side
    evicts; one lock guards the index and counters, I/O runs outside it.
    Eviction and reads race benignly: a block deleted mid-read is a miss.
    """

    def __init__(
        self,
        root: Path,
        *,
        model_tag: str,
        spec: CacheSpec,
        budget_bytes: int,
        other_bytes: Callable[[], int] = lambda: 0,
    ) -> None:
        """`other_bytes` tells what this cache's other files take (the agents' manifests):
        the budget counts them too, and blocks make room for them."""
        if not _SAFE_TAG.fullmatch(model_tag):
            raise ValueError(f"model tag {model_tag!r} is not a safe folder name")
        if spec.dtype not in ("bfloat16", "float16", "float32"):
            raise ValueError(f"unsupported cache dtype {spec.dtype!r}")
        self.model_tag = model_tag
        self.spec = spec
        self.budget_bytes = budget_bytes
        self.other_bytes = other_bytes
        self.model_root = root / model_tag
        self.blocks_dir = self.model_root / "blocks"
        self.quarantine_dir = self.model_root / "quarantine"
        self._max_file_bytes = _max_file_bytes(spec)
        for folder in (self.blocks_dir, self.quarantine_dir, self.model_root / "agents"):
            private_folder(folder, root, "the cache folder")  # caches hold conversations
        for owner in (self.model_root / "agents").iterdir():
            if owner.is_dir():
                check_private(owner, "the cache folder")
        self._lock = threading.Lock()
        self._index = DiskIndex()
        self._stats = DiskStats()
        self._open_index()

    # -- public API ----------------------------------------------------------------------------

    @property
    def stats(self) -> DiskStats:
        """A consistent snapshot of the counters."""
        with self._lock:
            quarantined = dict(self._stats.quarantined)
            return replace(
                self._stats,
                files=len(self._index.sizes),
                bytes=self._index.num_bytes,
                quarantined=quarantined,
            )

    def write(self, record: BlockRecord) -> int:
        """Store a page durably; return the bytes written, 0 when it was already on disk.

        Raises OSError (ENOSPC, EIO, …) after removing its temp file, and ValueError for a record
        that does not fit this tier's spec.
        """
        path = block_path(self.model_root, record.key)
        marked = record.ends_history and not self.ends_history(record.key)
        if path.exists() and not marked:
            self._touch(record.key, path)  # a rewrite is a use: keep it from eviction
            return 0
        data = self._encode(record)
        try:
            write_durably(path, data)
        except OSError:
            with self._lock:
                self._stats.write_errors += 1
            self._adopt_if_present(record.key, path)  # failed after the rename
            raise
        with self._lock:
            if not path.exists():  # deleted since the rename (`delete`): it stays deleted
                return 0
            self._index.add(record.key, len(data))
            # A partial block is found by its first group's page (`tails`).
            partial = len(record.token_ids) < self.spec.block_tokens
            if partial and record.parent_hash is not None and split_key(record.key)[1] == 0:
                self._index.add_tail(record.key, record.parent_hash, record.token_ids)
            if record.ends_history:
                self._index.end_history(record.key)
            self._stats.writes += 1
        return len(data)

    def read(self, key: int) -> BlockRecord | None:
        """The page, or None when it is absent or fails a check (then it is quarantined)."""
        path = block_path(self.model_root, key)
        try:
            record = self._decode(key, self._read_bytes(path))
        except OSError as exc:
            self._forget_unreadable(key, exc)
            return None
        except Rejected as rejected:
            self._quarantine(key, path, rejected)
            with self._lock:
                self._stats.misses += 1
            return None
        self._touch(key, path)
        with self._lock:
            self._stats.reads += 1
        return record

    def contains(self, key: int) -> bool:
        with self._lock:
            return key in self._index

    def ends_history(self, key: int) -> bool:
        """Whether the page on disk says a history ended with its block."""
        with self._lock:
            return self._index.ends_history(key)

    def read_ahead(self, key: int) -> None:
        """Ask the OS to bring a block's file into memory: a read of it is coming, and it is
        cheaper while the request waits than when the restore starts (Linux; a no-op elsewhere)."""
        advise = getattr(os, "posix_fadvise", None)
        if advise is None or not self.contains(key):
            return
        with contextlib.suppress(OSError):
            fd = os.open(block_path(self.model_root, key), os.O_RDONLY)
            try:
                advise(fd, 0, 0, os.POSIX_FADV_WILLNEED)
            finally:
                os.close(fd)

    def tails(self, parent: int) -> list[tuple[int, tuple[int, ...]]]:
        """(hash, token ids) of the partial blocks on disk that continue `parent`."""
        with self._lock:
            return self._index.tails(parent)

    def why_gone(self, key: int) -> str | None:
        """Why a block that was here left (`evicted` by the budget, or `corrupt`); None when it
        was never here, was deleted on request, or left too long ago to remember."""
        with self._lock:
            return self._index.why_gone(key)

    def delete(self, key: int, reason: str | None = None) -> bool:
        """Remove a block; True if it was there. No directory fsync: a deleted block that comes
        back after a crash is harmless (content-addressed, verified on read). The file goes
        under the lock, so a write that lands meanwhile either sees it gone and leaves the
        index alone, or is indexed first and deleted whole: the index never names a file that
        is not there (such a page would never be written again)."""
        with self._lock:
            size = self._index.remove(key, reason)
            block_path(self.model_root, key).unlink(missing_ok=True)
        return size is not None

    def size_of(self, key: int) -> int:
        """Bytes the block's file takes (0 when it is not on disk)."""
        with self._lock:
            return self._index.sizes.get(key, 0)

    def usage_bytes(self) -> int:
        with self._lock:
            return self._index.num_bytes

    def excess_bytes(self) -> int:
        """How far blocks and the other files together are over the budget (<= 0: within)."""
        other = self.other_bytes()
        with self._lock:
            return self._index.num_bytes + other - self.budget_bytes

    def evict_to_budget(self, protected: AbstractSet[int] = frozenset()) -> list[int]:
        """Delete least recently used pages, skipping those of `protected` block hashes, until
        usage fits the budget. Returns the evicted keys, oldest first."""
        other = self.other_bytes()
        with self._lock:
            excess = self._index.num_bytes + other - self.budget_bytes
            victims: list[int] = []
            for key, size in self._index.sizes.items():
                if excess <= 0:
                    break
                if split_key(key)[0] not in protected:
                    victims.append(key)
                    excess -= size
        evicted = [h for h in victims if self.delete(h, GONE_EVICTED)]
        with self._lock:
            self._stats.evicted += len(evicted)
        return evicted

    # -- index ---------------------------------------------------------------------------------

    def _open_index(self) -> None:
        """Drop temp files a crash left behind, then index blocks by file name, oldest mtime
        first, and partial tails by the token ids in their headers. Each file's size, header
        and identity are checked first (a damaged one is quarantined, and the tier opens
        without it); the tensors' bytes only on read."""
        for folder in (self.blocks_dir, self.model_root / "agents"):
            remove_temp_files(folder)
        found: list[tuple[float, int, int, Path]] = []
        for entry in os.scandir(self.blocks_dir):
            key = _parse_block_name(entry.name)
            with contextlib.suppress(OSError):  # gone meanwhile: nothing to index
                if key is not None and entry.is_file():
                    stat = entry.stat()
                    found.append((stat.st_mtime, key, stat.st_size, Path(entry.path)))
        for _, key, size, path in sorted(found):
            try:
                tail, ends_history = self._peek(key, path)
            except Rejected as rejected:
                self._index.add(key, size)  # so that it leaves as `corrupt`: a miss says why
                self._quarantine(key, path, rejected)
                continue
            except OSError as exc:
                log.warning("cache page %s unreadable, not indexed: %s", page_name(key), exc)
                continue
            self._index.add(key, size)
            if tail is not None:
                self._index.add_tail(key, *tail)
            if ends_history:
                self._index.end_history(key)

    def _peek(self, key: int, path: Path) -> tuple[tuple[int, tuple[int, ...]] | None, bool]:
        """What the index keeps of a page, read from its header and token tensor alone: (parent
        hash, token ids) of a partial block's first page (None for any other), and whether a
        history ended with the block. Rejected for a file too large, or whose header or
        identity fails its checks."""
        with path.open("rb") as file:
            self._check_size(os.fstat(file.fileno()).st_size)
            header = read_header(file)
            self._check_identity(key, header.metadata)
            if split_key(key)[1] != 0:
                return None, False
            tokens = _token_entry(header, self.spec.block_tokens)
            parent = header.metadata["parent_hash"]
            if tokens.shape[0] == self.spec.block_tokens:
                return None, _ends_history(header.metadata)
            if not parent:  # a partial first block: no tail to find it by
                return None, False
            file.seek(header.data_start + tokens.start)
            ids = np.frombuffer(file.read(tokens.end - tokens.start), dtype="<i4")
        return (parse_hash(parent), tuple(ids.tolist())), False

    def _read_bytes(self, path: Path) -> bytes:
        """The file's bytes, once its size says it may be a page (never a file read whole
        that could not be one)."""
        with path.open("rb") as file:
            self._check_size(os.fstat(file.fileno()).st_size)
            return file.read()

    def _check_size(self, size: int) -> None:
        if size > self._max_file_bytes:
            raise Rejected(QuarantineReason.TOO_LARGE, f"{size} bytes, more than a page takes")

    def _touch(self, key: int, path: Path) -> None:
        # mtime carries the LRU order across restarts; atime is unreliable (noatime mounts).
        try:
            os.utime(path)
            size = path.stat().st_size
        except OSError:
            return
        with self._lock:
            if key in self._index:  # not if evicted meanwhile: that would resurrect it
                self._index.add(key, size)

    def _adopt_if_present(self, key: int, path: Path) -> None:
        with contextlib.suppress(OSError), self._lock:
            self._index.add(key, path.stat().st_size)

    def _forget_unreadable(self, key: int, exc: OSError) -> None:
        reason = None if isinstance(exc, FileNotFoundError) else GONE_CORRUPT
        with self._lock:
            self._index.remove(key, reason)
            self._stats.misses += 1
            if not isinstance(exc, FileNotFoundError):
                self._stats.read_errors += 1
        if not isinstance(exc, FileNotFoundError):
            log.warning("cache page %s unreadable, treated as a miss: %s", page_name(key), exc)

    def _quarantine(self, key: int, path: Path, rejected: Rejected) -> None:
        moved = move_to_quarantine(path, self.quarantine_dir, rejected.reason)
        with self._lock:
            self._index.remove(key, GONE_CORRUPT)
            if moved:  # a concurrent reader may have moved it first: count it once
                counts = self._stats.quarantined
                counts[rejected.reason] = counts.get(rejected.reason, 0) + 1
        log.warning("cache page %s quarantined: %s", page_name(key), rejected)

    # -- encoding ------------------------------------------------------------------------------

    def _encode(self, record: BlockRecord) -> bytes:
        # bf16 has no numpy dtype: 16-bit KV travels as raw bits, the real dtype in metadata.
        arrays = record.kv.arrays()
        layout = page_layout(self.spec)
        if set(arrays) != set(layout):
            raise ValueError(f"a page of this cache holds {sorted(layout)}, not {sorted(arrays)}")
        for name, (shape, dtype) in layout.items():
            array = arrays[name]
            if array.shape != shape or array.dtype != dtype:
                raise ValueError(
                    f"{name} is {array.dtype}{list(array.shape)}, expected {dtype}{list(shape)}"
                )
        if not 1 <= len(record.token_ids) <= self.spec.block_tokens:
            raise ValueError(f"a block holds 1..{self.spec.block_tokens} tokens")
        tokens = np.asarray(record.token_ids, dtype=np.int32)
        arrays = {name: _little_endian(array) for name, array in arrays.items()}
        parent = "" if record.parent_hash is None else f"{record.parent_hash:016x}"
        block_hash, group = split_key(record.key)
        meta = {
            "format_version": FORMAT_VERSION,
            "block_hash": f"{block_hash:016x}",
            "parent_hash": parent,
            "model_tag": self.model_tag,
            "cache_spec": self.spec.tag(),
            "dtype": self.spec.dtype,
        }
        if self.spec.kv_dtype is not None:
            meta["kv_dtype"] = self.spec.kv_dtype
        if group:  # the first group's files are those of a model with one group
            meta["group"] = str(group)
        if record.ends_history:
            meta[_HISTORY_END] = "1"
        name = page_name(record.key)
        meta["checksum"] = block_checksum(arrays, tokens, name, parent, record.ends_history)
        return save_tensors({**arrays, "token_ids": tokens}, metadata=meta)

    def _decode(self, key: int, data: bytes) -> BlockRecord:
        meta = header_of(data).metadata
        self._check_identity(key, meta)
        try:
            tensors = load_tensors(data)
        except (SafetensorError, ValueError) as exc:
            raise Rejected(QuarantineReason.CORRUPT, str(exc)) from exc
        arrays, tokens = self._check_tensors(tensors)
        parent, ends_history = meta["parent_hash"], _ends_history(meta)
        checksum = block_checksum(arrays, tokens, page_name(key), parent, ends_history)
        if checksum != meta["checksum"]:
            raise Rejected(QuarantineReason.CHECKSUM, "content does not match its checksum")
        return BlockRecord(
            key=key,
            parent_hash=parse_hash(parent) if parent else None,
            token_ids=tuple(tokens.tolist()),
            kv=PageKV.from_arrays(arrays),
            ends_history=ends_history,
        )

    def _check_identity(self, key: int, meta: dict[str, str]) -> None:
        if meta.get("format_version") not in READABLE_VERSIONS:
            raise Rejected(QuarantineReason.VERSION, f"format {meta.get('format_version')!r}")
        if meta.get("model_tag") != self.model_tag:
            raise Rejected(QuarantineReason.OTHER_MODEL, f"model {meta.get('model_tag')!r}")
        same_values = meta.get("dtype") == self.spec.dtype
        if meta.get("cache_spec") != self.spec.tag() or not same_values:
            raise Rejected(QuarantineReason.OTHER_SPEC, f"spec {meta.get('cache_spec')!r}")
        if meta.get("kv_dtype") != self.spec.kv_dtype:
            raise Rejected(QuarantineReason.OTHER_SPEC, f"KV dtype {meta.get('kv_dtype')!r}")
        block_hash, group = split_key(key)
        if meta.get("block_hash") != f"{block_hash:016x}" or meta.get("group", "0") != str(group):
            raise Rejected(QuarantineReason.CORRUPT, "file name and page disagree")
        parent = meta.get("parent_hash")
        if parent is None or (parent and not HEX_HASH.fullmatch(parent)):
            raise Rejected(QuarantineReason.CORRUPT, "bad parent hash")
        if "checksum" not in meta:
            raise Rejected(QuarantineReason.CORRUPT, "no checksum")

    def _check_tensors(
        self, tensors: dict[str, np.ndarray]
    ) -> tuple[dict[str, np.ndarray], np.ndarray]:
        layout = page_layout(self.spec)
        if set(tensors) != {*layout, "token_ids"}:
            raise Rejected(QuarantineReason.SHAPE, f"tensors {sorted(tensors)}")
        tokens = tensors.pop("token_ids")
        for name, (shape, dtype) in layout.items():
            array = tensors[name]
            if array.shape != shape or array.dtype != dtype:
                raise Rejected(QuarantineReason.SHAPE, f"{name} {array.dtype}{list(array.shape)}")
        if tokens.dtype != np.int32 or tokens.ndim != 1:
            raise Rejected(QuarantineReason.SHAPE, f"token_ids {tokens.dtype}{tokens.shape}")
        if not 1 <= tokens.shape[0] <= self.spec.block_tokens:
            raise Rejected(QuarantineReason.SHAPE, f"{tokens.shape[0]} token ids")
        return {name: tensors[name] for name in layout}, tokens


def block_checksum(
    arrays: dict[str, np.ndarray],
    tokens: np.ndarray,
    block: str,
    parent: str,
    ends_history: bool = False,
) -> str:
    """CRC-32 over k, v and token_ids (little-endian raw bytes, in that order), an 8-bit page's
    scales after them (`cache/pages/page.py: SCALE_NAMES`), then the page's name (`page_name`)
    and the parent hash string, so a flipped parent link is caught like flipped KV, and
    `:history-end` after them on a page marked so (an unmarked page's checksum is a version 2
    file's). It guards against damage (torn writes, bit rot), not against whoever can write the
    cache folder: they could write a matching checksum whatever the algorithm."""
    crc = 0
    scales = [arrays[name] for name in SCALE_NAMES if name in arrays]
    for array in (arrays["k"], arrays["v"], tokens, *scales):
        crc = zlib.crc32(_little_endian(array).data, crc)
    named = f"{block}:{parent}:history-end" if ends_history else f"{block}:{parent}"
    return f"{zlib.crc32(named.encode(), crc):08x}"


def _ends_history(meta: dict[str, str]) -> bool:
    """Whether a file's metadata says a history ended with its block (a version 2 file never
    does, whatever it holds)."""
    return meta.get("format_version") == FORMAT_VERSION and meta.get(_HISTORY_END) == "1"


def _token_entry(header: BlockHeader, block_tokens: int) -> TensorEntry:
    """A first page's `token_ids` entry: 1 to `block_tokens` int32 ids, their bytes all there."""
    tokens = header.tensors.get("token_ids")
    if tokens is None or tokens.dtype != "I32" or len(tokens.shape) != 1:
        raise Rejected(QuarantineReason.SHAPE, "no int32 token_ids")
    count = tokens.shape[0]
    if not 0 < count <= block_tokens or tokens.end - tokens.start != 4 * count:
        raise Rejected(QuarantineReason.SHAPE, f"{count} token ids")
    return tokens


def _max_file_bytes(spec: CacheSpec) -> int:
    """The most a page's file of `spec` can take: a header at its largest, the arrays, and a
    full block's token ids."""
    arrays = sum(
        int(np.prod(shape)) * dtype.itemsize for shape, dtype in page_layout(spec).values()
    )
    return 8 + MAX_HEADER_BYTES + arrays + 4 * spec.block_tokens


def _little_endian(array: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(array, dtype=array.dtype.newbyteorder("<"))


def _parse_block_name(name: str) -> int | None:
    """The page key a file name gives (`page_name`), or None for any other file."""
    stem = name.removesuffix(BLOCK_SUFFIX)
    block, _, group = stem.partition("-")
    if stem == name or not HEX_HASH.fullmatch(block) or (group and not _GROUP.fullmatch(group)):
        return None
    key = page_key(int(block, 16), int(group or 0))
    return key if split_key(key)[1] < _MAX_GROUPS else None
