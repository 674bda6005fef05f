"""The torch backend on NVIDIA GPUs: Triton kernels that read and write the paged KV pool in
place and fuse a layer's small ops, and decode steps replayed as CUDA graphs. Imported only
where a CUDA device runs (and by the tests, which run the kernels in Triton's interpreter)."""

from __future__ import annotations

import functools
import logging
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # importing it needs Triton
    from semantic.backends.torch.cuda.kernels import CudaKernels

log = logging.getLogger(__name__)


@functools.cache
def cuda_kernels() -> CudaKernels | None:
    """The Triton kernels, or None (said once) where Triton does not import: the stock torch
    kernels then run, without decode graphs."""
    try:
        from semantic.backends.torch.cuda.kernels import CudaKernels
    except ImportError as exc:
        log.warning("no Triton (%s): CUDA runs the stock torch kernels, without graphs", exc)
        return None
    return CudaKernels()
