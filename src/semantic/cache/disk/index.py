"""What the disk tier holds, in memory: block sizes in LRU order, the partial tails under each
parent, the pages of blocks where a history ended, and why blocks that left the disk are gone.
No I/O; `DiskTier` guards it with its lock.
"""

from __future__ import annotations

from collections import OrderedDict

# Why a block that was on disk is not any more, as a miss reason names it.
GONE_EVICTED = "evicted"  # the disk budget dropped it
GONE_CORRUPT = "corrupt"  # it failed a check on read and was quarantined
MAX_GONE = 65_536  # remembered departures, oldest forgotten first (16 bytes of key each)


class DiskIndex:
    """The disk tier's index: `sizes` mirrors `blocks/` (least recently used first), `tails`
    holds the token ids of every partial block (a history's unfinished last block) by parent, so
    a prompt can find a tail on disk by content as it finds one in memory; `history_ends` the
    first-group pages of the full blocks a history ended with exactly (their files say so);
    `gone` remembers the most recent departures, so a miss can say why.

    Invariant: a hash in `tails` or `history_ends` is in `sizes`; `num_bytes` is the sum of
    `sizes`.
    """

    def __init__(self) -> None:
        self.sizes: OrderedDict[int, int] = OrderedDict()
        self.num_bytes = 0
        self._tails: dict[int, dict[int, tuple[int, ...]]] = {}
        self._parent_of_tail: dict[int, int] = {}
        self._history_ends: set[int] = set()
        self._gone: OrderedDict[int, str] = OrderedDict()

    def __contains__(self, block_hash: int) -> bool:
        return block_hash in self.sizes

    def add(self, block_hash: int, size: int) -> None:
        """Record a block as most recently used."""
        self.num_bytes += size - self.sizes.pop(block_hash, 0)
        self.sizes[block_hash] = size
        self._gone.pop(block_hash, None)

    def add_tail(self, block_hash: int, parent: int, token_ids: tuple[int, ...]) -> None:
        if block_hash in self.sizes:
            self._tails.setdefault(parent, {})[block_hash] = token_ids
            self._parent_of_tail[block_hash] = parent

    def end_history(self, key: int) -> None:
        if key in self.sizes:
            self._history_ends.add(key)

    def ends_history(self, key: int) -> bool:
        return key in self._history_ends

    def remove(self, block_hash: int, reason: str | None = None) -> int | None:
        """Forget a block; returns its size (None when it was not here). `reason` records it as
        gone (a deletion the user asked for records nothing)."""
        size = self.sizes.pop(block_hash, None)
        if size is None:
            return None
        self.num_bytes -= size
        self._history_ends.discard(block_hash)
        parent = self._parent_of_tail.pop(block_hash, None)
        if parent is not None:
            siblings = self._tails[parent]
            del siblings[block_hash]
            if not siblings:
                del self._tails[parent]
        if reason is not None:
            self._gone[block_hash] = reason
            while len(self._gone) > MAX_GONE:
                self._gone.popitem(last=False)
        return size

    def tails(self, parent: int) -> list[tuple[int, tuple[int, ...]]]:
        """(hash, token ids) of the partial blocks on disk that continue `parent`."""
        return list(self._tails.get(parent, {}).items())

    def why_gone(self, block_hash: int) -> str | None:
        return self._gone.get(block_hash)

    def check_integrity(self) -> None:
        assert self._parent_of_tail.keys() <= self.sizes.keys(), "a tail is not indexed"
        assert self._history_ends <= self.sizes.keys(), "a history's end outlived its page"
        assert self.num_bytes == sum(self.sizes.values()), "byte count diverged"
        tails = {h for siblings in self._tails.values() for h in siblings}
        assert tails == self._parent_of_tail.keys(), "tail index diverged"
