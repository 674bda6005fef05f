"""Every Triton kernel of the CUDA path in one object, as `CpuKernels` holds the CPU's: the pool
and the model's layers are handed the same one."""

from __future__ import annotations

from semantic.backends.torch.cuda.attention import TritonAttention
from semantic.backends.torch.cuda.layers import TritonLayers


class CudaKernels(TritonAttention, TritonLayers):
    """Paged attention read in place (`attention.py`) and a layer's small ops, fused
    (`layers.py`); both classes are stateless."""
