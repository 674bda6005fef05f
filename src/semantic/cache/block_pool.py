"""The block pool: which KV block ids are free, who holds them, and which hold reusable content.

Bookkeeping over integers only. The tensors live in the backend; this file never sees them.
"""

from __future__ import annotations

from collections import OrderedDict


class BlockPool:
    """Hands out block ids and takes them back.

    Every block is in exactly one state:
      - free: on the free list, no content worth keeping;
      - held: refcount > 0 (one count per sequence using it);
      - cached: refcount 0 but hashed, its content reusable; kept in LRU order and reclaimed
        (oldest first) only when the free list is empty.
    Invariants (see `check_integrity`): free + held + cached == total; a block id appears once;
    a hash maps to one block and back. Releasing a block that is not held is a no-op, so a
    double release cannot corrupt another owner's count.
    """

    def __init__(self, num_blocks: int) -> None:
        if num_blocks < 1:
            raise ValueError("a block pool needs at least one block")
        self.num_blocks = num_blocks
        self._free: list[int] = list(range(num_blocks - 1, -1, -1))  # pop() hands out 0 first
        self._refcount = [0] * num_blocks
        self._hash_of: dict[int, int] = {}
        self._block_of: dict[int, int] = {}
        self._cached: OrderedDict[int, None] = OrderedDict()  # refcount-0 hashed blocks, LRU first

    @property
    def num_available(self) -> int:
        """Blocks an allocation can take now: free ones plus reclaimable cached ones."""
        return len(self._free) + len(self._cached)

    @property
    def num_held(self) -> int:
        return self.num_blocks - self.num_available

    @property
    def num_cached(self) -> int:
        return len(self._cached)

    def allocate(self, count: int) -> list[int]:
        """Take `count` blocks, each with refcount 1; all or nothing."""
        if count > self.num_available:
            raise MemoryError(f"asked for {count} blocks, {self.num_available} available")
        blocks = [self._take_one() for _ in range(count)]
        for block in blocks:
            self._refcount[block] = 1
        return blocks

    def release(self, blocks: list[int]) -> None:
        """Drop one reference to each block; unreferenced blocks become cached or free."""
        for block in blocks:
            if self._refcount[block] == 0:
                continue
            self._refcount[block] -= 1
            if self._refcount[block] == 0:
                if block in self._hash_of:
                    self._cached[block] = None
                else:
                    self._free.append(block)

    def acquire(self, block: int) -> None:
        """Add a reference to a block found by hash (held or cached)."""
        if self._refcount[block] == 0:
            del self._cached[block]
        self._refcount[block] += 1

    def set_hash(self, block: int, block_hash: int) -> None:
        """Mark a held block's content as reusable under `block_hash` (set once per content)."""
        if block in self._hash_of or block_hash in self._block_of:
            return
        self._hash_of[block] = block_hash
        self._block_of[block_hash] = block

    def lookup(self, block_hash: int) -> int | None:
        return self._block_of.get(block_hash)

    def refcount(self, block: int) -> int:
        return self._refcount[block]

    def _take_one(self) -> int:
        if self._free:
            return self._free.pop()
        block, _ = self._cached.popitem(last=False)
        del self._block_of[self._hash_of.pop(block)]
        return block

    def check_integrity(self) -> None:
        """Raise AssertionError if any invariant is broken. Cheap enough for every test."""
        free, cached = set(self._free), set(self._cached)
        held = {b for b in range(self.num_blocks) if self._refcount[b] > 0}
        assert len(free) == len(self._free), "a block is on the free list twice"
        assert not (free & cached) and not (free & held) and not (cached & held), (
            "block in 2 states"
        )
        assert len(free) + len(cached) + len(held) == self.num_blocks, "a block is lost"
        assert all(b in self._hash_of for b in cached), "an unhashed block is cached"
        assert not (free & self._hash_of.keys()), "a free block still has a hash"
        assert all(self._block_of[h] == b for b, h in self._hash_of.items()), "hash map diverged"
        assert len(self._block_of) == len(self._hash_of), "hash map diverged"
