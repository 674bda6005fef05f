"""The disk tier: block files and their index (`tier`, `index`, `block_header`), the writer
thread (`writer`), the traffic between the pool and the disk (`tiering`), and the files' safety:
whole-or-absent writes, one writer per folder, folders no one else may write."""
