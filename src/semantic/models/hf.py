"""Reading a Hugging Face model directory: `config.json` as a `ModelConfig`, the (possibly sharded)
`*.safetensors` as float32 numpy arrays, one tensor at a time.

Safetensors files are memory-mapped and parsed here rather than through `safetensors.safe_open`,
whose numpy mode rejects bfloat16, the dtype most checkpoints ship in; torch is not needed to load.
MXFP4 tensors (GPT-OSS's experts: a `<name>_blocks` and a `<name>_scales` of uint8) are
dequantized into one float32 `<name>` in the layout of the unquantized checkpoint.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from semantic.core import DefaultSampling
from semantic.errors import ModelLoadFailed
from semantic.models.config import ModelConfig
from semantic.models.fingerprint import WeightsFile, fingerprint
from semantic.models.mxfp4 import dequantize_mxfp4

# Safetensors dtypes we can widen to float32; BF16 is read as its raw 16 bits. U8 only as the
# two halves of an MXFP4 tensor.
_DTYPES = {"F32": np.float32, "F16": np.float16, "BF16": np.uint16, "F64": np.float64}
_MXFP4_PARTS = ("_blocks", "_scales")
_INDEX = "model.safetensors.index.json"


class HFDir:
    """One Hugging Face checkpoint directory."""

    def __init__(self, path: Path) -> None:
        if not (path / "config.json").is_file():
            raise ModelLoadFailed(f"{path} is not a Hugging Face model directory (no config.json)")
        self.path = path
        self.files = _safetensors_files(path)

    @property
    def num_tensors(self) -> int:
        return sum(len(_read_header(file)[0]) for file in self.files)

    @property
    def chat_template(self) -> str | None:
        """From `chat_template.jinja` (newer saves) or `tokenizer_config.json`."""
        jinja = self.path / "chat_template.jinja"
        if jinja.is_file():
            return jinja.read_text(encoding="utf-8")
        template = _read_json(self.path / "tokenizer_config.json").get("chat_template")
        if isinstance(template, list):
            # Named templates: [{"name": "default", "template": ...}, {"name": "tool_use", ...}]
            named = {entry["name"]: entry["template"] for entry in template}
            template = named.get("default")
        return str(template) if template else None

    def config(self) -> ModelConfig:
        """`config.json`, with `generation_config.json`'s end tokens added to the EOS ids."""
        try:
            config = ModelConfig.from_hf(_read_json(self.path / "config.json"))
        except KeyError as exc:
            raise ModelLoadFailed(f"{self.path}/config.json lacks {exc}") from exc
        eos = _read_json(self.path / "generation_config.json").get("eos_token_id")
        extra = eos if isinstance(eos, list) else ([] if eos is None else [eos])
        return replace(config, eos_token_ids=tuple(dict.fromkeys([*config.eos_token_ids, *extra])))

    def sampling(self) -> DefaultSampling | None:
        """The sampling `generation_config.json` recommends, unless it does not sample."""
        generation = _read_json(self.path / "generation_config.json")
        if generation.get("do_sample") is False:
            return None
        return DefaultSampling.recommended(generation)

    def fingerprint(self) -> str:
        """The weights' fingerprint: `config.json`, which shapes the computation, then each
        shard's tensor table and samples of every tensor's bytes."""
        files = []
        for file in self.files:
            header, start = _read_header(file)
            spans = [entry["data_offsets"] for entry in header.values()]
            files.append(WeightsFile(file, start, [(start + b, start + e) for b, e in spans]))
        return fingerprint(files, extra=(self.path / "config.json").read_bytes())

    def weights(self) -> Iterator[tuple[str, np.ndarray]]:
        """Every tensor of every shard, as float32, in file order (an MXFP4 tensor once both
        its halves are read)."""
        halves: dict[str, np.ndarray] = {}
        for file in self.files:
            for name, array in _read_safetensors(file):
                if not name.endswith(_MXFP4_PARTS):
                    yield name, array
                    continue
                halves[name] = array
                base = name.removesuffix("_blocks").removesuffix("_scales")
                blocks, scales = halves.get(base + "_blocks"), halves.get(base + "_scales")
                if blocks is not None and scales is not None:
                    del halves[base + "_blocks"], halves[base + "_scales"]
                    yield base, _dequantized_mxfp4(base, blocks, scales)
        if halves:
            raise ModelLoadFailed(f"MXFP4 tensors without their other half: {sorted(halves)}")


def _safetensors_files(path: Path) -> list[Path]:
    index = path / _INDEX
    if index.is_file():
        weight_map: dict[str, str] = _read_json(index)["weight_map"]
        files = [path / name for name in sorted(set(weight_map.values()))]
    else:
        files = sorted(path.glob("*.safetensors"))
    if not files:
        raise ModelLoadFailed(f"{path} has no *.safetensors weights")
    missing = [str(file) for file in files if not file.is_file()]
    if missing:
        raise ModelLoadFailed(f"{path}: weight shards listed in {_INDEX} are missing: {missing}")
    return files


def _read_header(file: Path) -> tuple[dict[str, Any], int]:
    """The tensor table of a safetensors file and where its data starts.

    Layout: u64 little-endian header length, the JSON header, then the raw tensor bytes.
    """
    with file.open("rb") as handle:
        (length,) = struct.unpack("<Q", handle.read(8))
        header: dict[str, Any] = json.loads(handle.read(length))
    header.pop("__metadata__", None)
    return header, 8 + length


def _read_safetensors(file: Path) -> Iterator[tuple[str, np.ndarray]]:
    header, start = _read_header(file)
    data = np.memmap(file, dtype=np.uint8, mode="r", offset=start)
    for name, entry in header.items():
        begin, end = entry["data_offsets"]
        yield name, _to_float32(data[begin:end], entry["dtype"], entry["shape"], name)


def _dequantized_mxfp4(name: str, blocks: np.ndarray, scales: np.ndarray) -> np.ndarray:
    """[E, out, G, 16] blocks and [E, out, G] scales → [E, in, out] float32, the layout of the
    unquantized tensor (`transformers` transposes the same way)."""
    try:
        return np.ascontiguousarray(dequantize_mxfp4(blocks, scales).swapaxes(-1, -2))
    except ValueError as exc:
        raise ModelLoadFailed(f"MXFP4 tensor {name!r}: {exc}") from exc


def _to_float32(raw: np.ndarray, dtype: str, shape: list[int], name: str) -> np.ndarray:
    if dtype == "U8" and name.endswith(_MXFP4_PARTS):
        return np.array(raw.reshape(shape))  # a copy: the memory map may close
    if dtype not in _DTYPES:
        raise ModelLoadFailed(
            f"tensor {name!r} has dtype {dtype}; only float weights are supported"
        )
    array = raw.view(_DTYPES[dtype]).reshape(shape)
    if dtype == "BF16":
        # bfloat16 is the top half of a float32: shift the 16 bits up and reinterpret.
        return (array.astype(np.uint32) << 16).view(np.float32)
    return array.astype(np.float32)  # always a copy, so the memory map can close


def _read_json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    data: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    return data
