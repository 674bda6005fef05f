"""Kill -9 during cache writes: after a restart nothing partial is loaded, and every block that
was acknowledged as durable is still there, intact."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pytest

from semantic.cache.disk.tier import BlockRecord, DiskTier, model_tag
from semantic.cache.pages.page import PageKV
from semantic.core import CacheSpec

REPO = Path(__file__).resolve().parents[2]
SPEC = CacheSpec(num_layers=8, num_kv_heads=2, head_dim=128, dtype="bfloat16", block_tokens=128)
TAG = model_tag("kill9-model", SPEC, "0f" * 16)
CHUNK = 1 << 16  # a block file is ~1 MiB: many chunks

# The child writes blocks forever and prints each hash once its write is fsynced and renamed.
# After the first chunk of each block it says "mid" and waits for a line on stdin: the parent
# lets it go on, or kills it there, while the block is half written (by order, not by a pause
# the parent must beat: a loaded machine cannot make it miss).
CHILD = """
import os
import sys
from pathlib import Path
from semantic.cache.disk.tier import DiskTier
from semantic.cache.disk.writer import DiskWriter
from tests.unit.test_disk_kill9 import CHUNK, SPEC, TAG, expected_record

root, block_hash = Path(sys.argv[1]), int(sys.argv[2])
real_write = os.write

def paused_write(fd, data):
    first_chunk = os.lseek(fd, 0, os.SEEK_CUR) == 0
    written = real_write(fd, data[:CHUNK])
    if first_chunk and written < len(data):
        print("mid", flush=True)
        sys.stdin.readline()
    return written

os.write = paused_write
writer = DiskWriter(DiskTier(root, model_tag=TAG, spec=SPEC, budget_bytes=1 << 40))

def ack(block_hash):
    def on_done(written, error):
        if error is None:
            print(f"{block_hash:016x}", flush=True)
    return on_done

while True:
    writer.submit(expected_record(block_hash), ack(block_hash))
    block_hash += 1
    if writer.pending > 4:
        writer.flush()
"""


def expected_record(block_hash: int) -> BlockRecord:
    """Content derived from the hash, so the parent knows what every file must hold."""
    shape = (SPEC.num_layers, SPEC.block_tokens, SPEC.num_kv_heads, SPEC.head_dim)
    bits = (np.arange(np.prod(shape), dtype=np.uint64) * 2654435761 + block_hash) % 65536
    k = bits.astype(np.uint16).reshape(shape)
    tokens = tuple((block_hash * 7 + i) % 50_000 for i in range(SPEC.block_tokens))
    return BlockRecord(block_hash, block_hash - 1 or None, tokens, PageKV(k, k[::-1].copy()))


def _write_until_killed(root: Path, first_hash: int, acks_before_kill: int) -> set[int]:
    """Run the writer child; SIGKILL it in the middle of a block write once it has acknowledged
    `acks_before_kill` blocks. Returns every hash it acknowledged."""
    # stderr to a file: a pipe nobody reads while the loop runs could fill and block the child.
    with tempfile.TemporaryFile() as stderr:
        proc = subprocess.Popen(
            [sys.executable, "-c", CHILD, str(root), str(first_hash)],
            cwd=REPO,
            env={**os.environ, "PYTHONPATH": f"{REPO / 'src'}{os.pathsep}{REPO}"},
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=stderr,
        )
        assert proc.stdin is not None and proc.stdout is not None
        acks: set[int] = set()
        try:
            while True:
                line = proc.stdout.readline()
                if not line:
                    stderr.seek(0)
                    raise AssertionError(f"the writer died early: {stderr.read().decode()[-2000:]}")
                if line == b"mid\n" and len(acks) >= acks_before_kill:
                    break
                if line == b"mid\n":
                    proc.stdin.write(b"go on\n")
                    proc.stdin.flush()
                else:
                    acks.add(int(line, 16))
        finally:  # killed mid-write on purpose, or because this test failed: never left running
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
            proc.stdin.close()
            proc.stdout.close()
    assert proc.returncode == -signal.SIGKILL
    return acks


@pytest.mark.timeout(120)
def test_kill9_mid_write_keeps_every_acknowledged_block_and_loads_nothing_partial(
    tmp_path: Path,
) -> None:
    acknowledged: set[int] = set()
    for round_no in range(3):  # each restart also cleans up after the previous kill
        acknowledged |= _write_until_killed(tmp_path, round_no * 1_000_000 + 1, 6)
        blocks_dir = tmp_path / TAG / "blocks"
        assert [p for p in blocks_dir.iterdir() if p.name.endswith(".tmp")]  # killed mid-write
        tier = DiskTier(tmp_path, model_tag=TAG, spec=SPEC, budget_bytes=1 << 40)
        assert not [p for p in tier.model_root.rglob("*") if p.name.endswith(".tmp")]
        on_disk = [int(p.name[:16], 16) for p in tier.blocks_dir.iterdir()]
        assert acknowledged <= set(on_disk)
        for block_hash in on_disk:  # acknowledged or not, a file under its name is whole
            got = tier.read(block_hash)
            want = expected_record(block_hash)
            assert got is not None, f"block {block_hash:016x} was lost or partial"
            assert got.token_ids == want.token_ids and got.parent_hash == want.parent_hash
            assert np.array_equal(got.kv.k, want.kv.k) and np.array_equal(got.kv.v, want.kv.v)
        assert tier.stats.quarantined == {}
