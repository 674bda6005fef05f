"""The torch backend on NVIDIA GPUs: Triton kernels that read and write the paged KV pool in
place and fuse a layer's small ops, and decode steps replayed as CUDA graphs. Imported only
where a CUDA device runs (and by the tests, which run the kernels in Triton's interpreter)."""
