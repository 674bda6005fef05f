"""The torch backend's own CPU kernels: paged decode and prefill attention read in place, the
small-row linear over weights packed in 16-row panels (bf16 `PanelWeight`, or int8 with a scale
per row, `Int8PanelWeight`, against x quantized per block), the linear over weights in quantized
groups (a GGUF's Q4_K .. Q8_0 blocks as the file holds them: `blocks.py`), the 8-bit KV cache's
write, and the small per-layer ops of a step: RMSNorm, rope and SwiGLU's middle.

A C++ extension (AVX-512 with BF16 and VNNI dot products), built once per sources, compiler
flags, torch build and Python into a folder of the user cache named by their digest, never by a
checkout's path: every checkout and venv with the same ones loads that build in well under a
second. A build says that it is building and how long it took. The library runs as this user,
so it is loaded only from folders that are this user's alone (`cache/disk/private_folder.py`),
made with mode 0700.
`cpu_kernels()` returns None, logged once, where it cannot run: another architecture, a CPU
without AVX-512 BF16 or VNNI, no working compiler, or a build folder others could write; callers
then keep the stock torch kernels.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import hashlib
import importlib.util
import logging
import os
import platform
import shutil
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

import torch
import torch.nn.functional as F

from semantic.backends.torch.int8 import quantize_rows
from semantic.cache.disk.private_folder import check_private, private_folder
from semantic.errors import FolderNotPrivate
from semantic.settings.settings import default_cache_dir

log = logging.getLogger(__name__)

_NAME = "semantic_cpu_kernels"
_SOURCES = (
    "bindings.cpp",
    "block_linear.cpp",
    "kv_write.cpp",
    "paged_attention.cpp",
    "prefill_attention.cpp",
    "rms_norm.cpp",
    "rope.cpp",
    "small_linear.cpp",
    "swiglu.cpp",
)
_HEADERS = ("kernels.h", "simd.h")
# Explicit ISA flags, not -march=native: a cache folder shared between machines must not hold
# code for a CPU that `_missing_feature` did not check.
_CFLAGS = (
    "-O3",
    "-mavx512f",
    "-mavx512bw",
    "-mavx512vl",
    "-mavx512dq",
    "-mavx512bf16",
    "-mavx512vnni",
    "-mfma",
    "-fno-math-errno",
    "-fopenmp",  # at::parallel_for is inline OpenMP; the process's libgomp is torch's
)
_LDFLAGS = ("-fopenmp",)
_FOLDER = Path(__file__).parent
_WHAT = "the CPU kernels' build folder"


class CpuKernels:
    """Typed entry points of the compiled extension; see the `.cpp` files for how each works."""

    def __init__(self, module: ModuleType) -> None:
        self._module = module

    def supports_attention(self, head_dim: int, heads: int, dtype: torch.dtype) -> bool:
        """Whether decode and prefill attention both run these shapes (head_dim 16 to 256)."""
        return dtype in (torch.bfloat16, torch.float32) and bool(
            self._module.decode_supported(head_dim, heads)
        )

    def decode_attention(
        self,
        q: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        block_tables: torch.Tensor,
        context_lens: torch.Tensor,
        scale: float,
        window: int | None = None,
        sinks: torch.Tensor | None = None,
        k_scales: torch.Tensor | None = None,
        v_scales: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """q: [B, H, D]; caches [num_blocks, block_tokens, KVH, D]; block_tables [B, max_blocks]
        int64; context_lens [B] int64 → [B, H, D]: each query over its first context_lens keys,
        or only the last `window` of them; `sinks` [H] fp32: a logit per head with no value.
        int8 caches (an 8-bit pool) come with their rows' scales, `k_scales` and `v_scales`
        [num_blocks, block_tokens, KVH] bf16."""
        out: torch.Tensor = self._module.paged_decode_attention(
            q,
            k_cache,
            v_cache,
            block_tables,
            context_lens,
            scale,
            window or 0,
            sinks,
            k_scales,
            v_scales,
        )
        return out

    def prefill_attention(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        block_table: torch.Tensor | None,
        context_len: int,
        scale: float,
        window: int | None = None,
        sinks: torch.Tensor | None = None,
        k_scales: torch.Tensor | None = None,
        v_scales: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """q: [n, H, D] at positions context_len.. → [n, H, D], causal over the sequence's keys
        (with a `window`, the query at p over keys p - window + 1 .. p). k, v: the pool caches
        [num_blocks, block_tokens, KVH, D] read through `block_table` [m] int64; or, with no
        context and no table, the chunk's own [n, KVH, D]. `sinks` and, for int8 pools, the
        scales as for decode."""
        out: torch.Tensor = self._module.paged_prefill_attention(
            q, k, v, block_table, context_len, scale, window or 0, sinks, k_scales, v_scales
        )
        return out

    def linear(
        self, x: torch.Tensor, weight: PanelWeight | Int8PanelWeight, bias: torch.Tensor | None
    ) -> torch.Tensor:
        """x: [M, K] bf16 → x @ weight.T + bias: [M, N] bf16. It streams the weight once for all
        rows, but its compute grows with M (see linear.py for the switch to oneDNN in bf16); an
        int8 weight's x is quantized to int8 per block of 32 values (small_linear.cpp)."""
        out: torch.Tensor
        if isinstance(weight, Int8PanelWeight):
            out = self._module.small_linear_int8(
                x, weight.panels, weight.scales, weight.out_features, bias
            )
        else:
            out = self._module.small_linear(x, weight.panels, weight.out_features, bias)
        return out

    def block_linear(
        self,
        x: torch.Tensor,
        values: torch.Tensor,
        codes: torch.Tensor,
        supers: torch.Tensor,
        out_features: int,
        bias: torch.Tensor | None,
    ) -> torch.Tensor:
        """x: [M, K] bf16 → x @ W.T + bias: [M, N] bf16, W in quantized groups of 32 inputs
        (`blocks.GroupWeight`: a GGUF's Q4_K, Q5_K or Q6_K blocks or the byte form), x quantized
        to int8 a step per 256 inputs, finer for small groups of 32 (block_linear.cpp)."""
        out: torch.Tensor = self._module.block_linear(x, values, codes, supers, out_features, bias)
        return out

    def flat_linear(
        self,
        x: torch.Tensor,
        values: torch.Tensor,
        factors: torch.Tensor,
        offset: int,
        out_features: int,
        bias: torch.Tensor | None,
    ) -> torch.Tensor:
        """x: [M, K] bf16 → x @ W.T + bias: [M, N] bf16, W in per-32 blocks (`blocks.FlatWeight`:
        a GGUF's Q4_0 .. Q8_0, `d · (u − offset) + m` per group), x quantized as for
        `block_linear`."""
        out: torch.Tensor = self._module.flat_linear(x, values, factors, offset, out_features, bias)
        return out

    def write_kv_int8(
        self, x: torch.Tensor, slots: torch.Tensor, cache: torch.Tensor, scales: torch.Tensor
    ) -> None:
        """x: [T, KVH, D] bf16 → an 8-bit pool's `cache` [blocks, block_tokens, KVH, D] int8 and
        `scales` [blocks, block_tokens, KVH] bf16 at `slots` [T] int64, each row quantized as
        `int8.quantize_rows` does."""
        self._module.write_kv_int8(x, slots, cache, scales)

    def rope(self, x: torch.Tensor, cos: torch.Tensor, sin_signed: torch.Tensor) -> torch.Tensor:
        """x: [T, N, D] bf16 (each token's heads contiguous), cos and sin_signed [T, 1, D] →
        `models.rope.apply_rope(x, cos, sin_signed)`, bit for bit, in one pass."""
        out: torch.Tensor = self._module.rope(x, cos, sin_signed)
        return out

    def swiglu(self, gate_up: torch.Tensor) -> torch.Tensor:
        """gate_up: [T, 2·I] bf16 → silu(gate) · up [T, I], rounded as torch's two ops round."""
        out: torch.Tensor = self._module.swiglu(gate_up)
        return out

    def rms_norm(
        self, x: torch.Tensor, weight: torch.Tensor, eps: float, round_normed: bool = True
    ) -> torch.Tensor:
        """x: [T, D] bf16 or fp32 → RMSNorm in fp32, rounded to x's dtype, times `weight`; with
        `round_normed` false, times `weight` in fp32 and then rounded (Gemma, GPT-OSS)."""
        out: torch.Tensor = self._module.rms_norm(x, weight, eps, round_normed)
        return out

    def add_rms_norm(
        self,
        x: torch.Tensor,
        delta: torch.Tensor,
        weight: torch.Tensor,
        eps: float,
        round_normed: bool = True,
    ) -> torch.Tensor:
        """`x += delta` in place, then `rms_norm(x, ...)`: two passes here (at decode sizes the
        add costs a few µs; a CUDA step fuses them)."""
        x += delta
        return self.rms_norm(x, weight, eps, round_normed)

    def unpack(self, weight: PanelWeight, out: torch.Tensor) -> torch.Tensor:
        """The plain [N, K] bf16 weight, written into `out` (contiguous, that shape)."""
        self._module.unpack_weight(weight.panels, out)
        return out


@dataclass(slots=True, frozen=True)
class PanelWeight:
    """A bf16 weight [N, K] in the small-row linear's layout: panels of 16 output rows,
    `panels` [ceil(N/16), ceil(K/2), 16, 2], each 64 bytes one input pair of 16 outputs
    (oneDNN's BA16a16b2a), zero-padded. See small_linear.cpp for why."""

    panels: torch.Tensor
    out_features: int
    in_features: int

    @classmethod
    def pack(cls, weight: torch.Tensor) -> PanelWeight:
        n, k = weight.shape
        return cls(_panels(weight), n, k)

    def rows(self, ids: torch.Tensor) -> torch.Tensor:
        """Rows `ids` [T] of the plain weight → [T, K]: a tied model's embedding lookup."""
        return _panel_rows(self.panels, ids, self.in_features)


@dataclass(slots=True, frozen=True)
class Int8PanelWeight:
    """A weight [N, K] quantized to int8 with one fp32 scale per output row (symmetric: w ≈ q ·
    scale, q in -127..127, scale = the row's largest |w| / 127), laid out for VNNI's byte dot
    product: `panels` [ceil(N/16), Kp/4, 16, 4] uint8, Kp = K rounded up to 32, each 64 bytes
    four consecutive inputs of 16 outputs, each byte q + 128 (the instruction's unsigned
    operand), padding 128 (zero); `scales` [16·ceil(N/16)] padded with ones. Why per row and
    not per group: docs/design.md; the kernel: small_linear.cpp."""

    panels: torch.Tensor
    scales: torch.Tensor
    out_features: int
    in_features: int

    @classmethod
    def pack(cls, weight: torch.Tensor) -> Int8PanelWeight:
        """`weight` (any float dtype) quantized: each value rounded to its nearest step."""
        n, k = weight.shape
        q, scales = quantize_rows(weight, torch.float32)
        biased = F.pad(q.to(torch.int16) + 128, (0, -k % 32, 0, -n % 16), value=128)
        panels = biased.to(torch.uint8).view(-1, 16, biased.shape[1] // 4, 4).transpose(1, 2)
        return cls(panels.contiguous(), F.pad(scales, (0, -n % 16), value=1.0), n, k)

    def rows(self, ids: torch.Tensor) -> torch.Tensor:
        """Rows `ids` [T] dequantized to bf16 → [T, K]: a tied model's embedding lookup."""
        q = _panel_rows(self.panels, ids, self.in_features).to(torch.int16) - 128
        return (q.float() * self.scales[ids, None]).bfloat16()


def _panels(weight: torch.Tensor) -> torch.Tensor:
    """[N, K] → [ceil(N/16), ceil(K/2), 16, 2], zero-padded (see `PanelWeight`)."""
    n, k = weight.shape
    padded = F.pad(weight, (0, k % 2, 0, -n % 16))  # [16·P, 2·J]
    return padded.view(-1, 16, padded.shape[1] // 2, 2).transpose(1, 2).contiguous()


def _panel_rows(panels: torch.Tensor, ids: torch.Tensor, in_features: int) -> torch.Tensor:
    picked = panels[ids // 16, :, ids % 16]  # [T, inputs / group, group]
    return picked.flatten(1)[:, :in_features]


def cpu_kernels() -> CpuKernels | None:
    """The compiled kernels, or None where they cannot run (see `unavailable_reason`)."""
    return _load()[0]


def unavailable_reason() -> str | None:
    """Why `cpu_kernels()` is None: a missing CPU feature or toolchain, or the build error."""
    return _load()[1]


@functools.cache
def _load() -> tuple[CpuKernels | None, str | None]:
    # Cached: the extension is loaded into the process once, and why not is logged once.
    missing = _missing_feature()
    if missing is not None:
        log.info("semantic CPU kernels off (%s): stock torch kernels instead", missing)
        return None, missing
    try:
        module = _build()
    except FolderNotPrivate as exc:  # what others could have put there never runs here
        log.warning("semantic CPU kernels off, stock torch kernels instead: %s", exc)
        return None, str(exc)
    except Exception as exc:  # a compiler error, a missing toolchain: never fatal
        log.warning("semantic CPU kernels failed to build, stock torch kernels instead: %s", exc)
        return None, f"the CPU kernels failed to build: {exc}"
    return CpuKernels(module), None


def _missing_feature() -> str | None:
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return f"{platform.machine()} is not x86-64"
    if torch.backends.cpu.get_cpu_capability() != "AVX512":
        return "the CPU lacks AVX-512"
    if not torch.cpu._is_avx512_bf16_supported():
        return "the CPU lacks AVX-512 BF16"
    if not torch.cpu._is_vnni_supported():
        return "the CPU lacks AVX-512 VNNI"
    if shutil.which(os.environ.get("CXX", "c++")) is None:
        return "no C++ compiler on PATH"  # the one torch's extension builder calls
    return None


def build_directory(sources: Path = _FOLDER) -> Path:
    """<user cache>/semantic/kernels/torch-<version>-py<version>-<digest>: the digest covers the
    sources' contents, the compiler flags and torch's build, and nothing of where they lie."""
    return _build_folder(_read_sources(sources))


def _read_sources(sources: Path) -> dict[str, bytes]:
    return {name: (sources / name).read_bytes() for name in (*_SOURCES, *_HEADERS)}


def _build_folder(files: dict[str, bytes]) -> Path:
    digest = hashlib.sha256(" ".join([*_CFLAGS, *_LDFLAGS]).encode())
    digest.update(f"{torch.__version__} {torch.version.git_version}".encode())
    for name, text in files.items():
        digest.update(f"{name} {len(text)}\n".encode())
        digest.update(text)
    python = f"py{sys.version_info.major}{sys.version_info.minor}"
    tag = f"torch-{torch.__version__}-{python}-{digest.hexdigest()[:16]}"
    return default_cache_dir() / "kernels" / tag


def _build(sources: Path = _FOLDER) -> ModuleType:
    """The extension built from `sources`: loaded from its folder when a build is there (from
    any checkout), else built there first, one process at a time. FolderNotPrivate, before
    anything is loaded, when the folder or the library is not this user's alone."""
    files = _read_sources(sources)
    folder = private_folder(_build_folder(files), default_cache_dir(), _WHAT)
    library = folder / f"{_NAME}.so"
    with _build_lock(folder):
        if library.exists():
            check_private(library, "the CPU kernels' library")
            try:
                return _import(library)
            except ImportError as exc:  # a build cut short: a truncated library
                log.warning("the CPU kernels in %s do not load (%s): building again", folder, exc)
                library.unlink()
        return _compile(files, folder)


@contextlib.contextmanager
def _build_lock(folder: Path) -> Iterator[None]:
    """Held while a process looks for, or builds, the library: a second process that starts
    meanwhile waits for the first's build instead of compiling the same files over it."""
    with open(folder / "build.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield  # closing the file drops the lock


def _import(library: Path) -> ModuleType:
    started = time.perf_counter()
    spec = importlib.util.spec_from_file_location(_NAME, library)
    if spec is None or spec.loader is None:
        raise ImportError(f"{library} is not a Python extension")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    log.info(
        "semantic CPU kernels loaded in %.2f s from %s", time.perf_counter() - started, library
    )
    return module


def _compile(files: dict[str, bytes], folder: Path) -> ModuleType:
    """Build from copies of the sources inside `folder`, so its build files name that folder
    alone and no checkout's path."""
    from torch.utils import cpp_extension  # imports setuptools: only when building

    copies = private_folder(folder / "src", folder, _WHAT)  # compiled into the library
    for name, text in files.items():
        (copies / name).write_bytes(text)
    log.info(
        "building the semantic CPU kernels into %s (once per sources, compiler flags and torch "
        "build; 15-60 s, by the cores)",
        folder,
    )
    started = time.perf_counter()
    module = cpp_extension.load(
        name=_NAME,
        sources=[str(copies / name) for name in _SOURCES],
        # lists of their own: torch appends its own flags to the ones it is given
        extra_cflags=list(_CFLAGS),
        extra_ldflags=list(_LDFLAGS),
        build_directory=str(folder),
        verbose=False,
    )
    _keep_private(folder / f"{_NAME}.so")
    log.info("built the semantic CPU kernels in %.1f s", time.perf_counter() - started)
    return module


def _keep_private(library: Path) -> None:
    """The built library, made writable by this user alone: the compiler writes it under the
    umask, and the next start refuses one that others may change (`check_private`)."""
    with contextlib.suppress(FileNotFoundError):
        library.chmod(library.stat().st_mode & ~0o022)
