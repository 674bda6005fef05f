"""Prepared weights: a model built once is mapped from the user cache on the next start, gives
the logits of the model converted from the checkpoint, and a file that does not load is never
trusted: the checkpoint is converted again and the file rewritten."""

from __future__ import annotations

import base64
import pickle
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from semantic.backends.torch.kernels import Int8PanelWeight, cpu_kernels, unavailable_reason
from semantic.backends.torch.prepared import KEEP, SUFFIX
from semantic.backends.torch.runner import TorchRunner
from semantic.core import Batch, BatchItem, SamplingParams
from tests.unit.tiny_llama import tiny_llama

pytestmark = pytest.mark.skipif(
    cpu_kernels() is None, reason=f"needs our CPU kernels (AVX-512 BF16): {unavailable_reason()}"
)
PROMPT = [5, 17, 42, 99, 3, 250, 7, 1, 64, 128]


def runner(
    folder: Path,
    weights: list[tuple[str, np.ndarray]],
    fingerprint: str = "weights-a",
    weight_format: str = "bf16",
) -> TorchRunner:
    config, _ = tiny_llama(tied=True)
    return TorchRunner(
        config,
        weights,
        block_tokens=16,
        cache_budget_mb=1,
        dtype="bfloat16",
        prepared_dir=folder,
        weights_fingerprint=fingerprint,
        weight_format=weight_format,
    )


def logits(model: TorchRunner) -> torch.Tensor:
    item = BatchItem(0, PROMPT, 0, [[0]], True, SamplingParams(temperature=0.0), len(PROMPT))
    return model.forward_logits(Batch([item]))


def prepared_files(folder: Path) -> list[Path]:
    return sorted(folder.glob(f"*{SUFFIX}"))


def test_a_second_start_maps_the_prepared_model_and_gives_the_same_logits(tmp_path: Path):
    _, weights = tiny_llama(tied=True)
    converted = runner(tmp_path, weights)
    (written,) = prepared_files(tmp_path)
    # No weights at all: a model that came from anywhere but the file could not be built.
    mapped = runner(tmp_path, [])
    assert torch.equal(logits(mapped), logits(converted))
    assert prepared_files(tmp_path) == [written]
    embedding = mapped.model.embed.weight.panels  # type: ignore[attr-defined]
    with safe_open(written, framework="pt") as file:  # a tied embedding and head: held once
        names = file.keys()
        shapes = [file.get_slice(name).get_shape() for name in names]
    assert shapes.count(list(embedding.shape)) == 1
    assert mapped.model.lm_head is mapped.model.embed


def test_int8_weights_get_a_file_of_their_own_that_maps_back_to_int8_panels(tmp_path: Path):
    _, weights = tiny_llama(tied=True)
    bf16 = runner(tmp_path, weights)
    (bf16_file,) = prepared_files(tmp_path)
    converted = runner(tmp_path, weights, weight_format="int8")
    (int8_file,) = set(prepared_files(tmp_path)) - {bf16_file}
    assert int8_file.stat().st_size < bf16_file.stat().st_size * 0.7
    mapped = runner(tmp_path, [], weight_format="int8")  # from the file: no weights given
    assert torch.equal(logits(mapped), logits(converted))
    assert not torch.equal(logits(mapped), logits(bf16))
    head = mapped.model.lm_head.weight  # type: ignore[attr-defined]
    assert isinstance(head, Int8PanelWeight) and head.panels.dtype == torch.uint8
    assert mapped.model.lm_head is mapped.model.embed
    assert len(prepared_files(tmp_path)) == 2


def test_other_weights_get_a_file_of_their_own_and_the_least_recently_used_go(tmp_path: Path):
    _, weights = tiny_llama(tied=True)
    for index in range(KEEP + 1):
        runner(tmp_path, weights, fingerprint=f"weights-{index}")
    assert len(prepared_files(tmp_path)) == KEEP
    with pytest.raises(Exception, match="lacks weight"):  # the first one's file went
        runner(tmp_path, [], fingerprint="weights-0")
    runner(tmp_path, [], fingerprint=f"weights-{KEEP}")  # the last one's is there


def test_a_corrupt_file_is_converted_again_and_rewritten(tmp_path: Path):
    _, weights = tiny_llama(tied=True)
    expected = logits(runner(tmp_path, weights))
    (path,) = prepared_files(tmp_path)
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    assert torch.equal(logits(runner(tmp_path, weights)), expected)
    assert torch.equal(logits(runner(tmp_path, [])), expected)  # rewritten whole


def test_a_file_naming_code_outside_the_model_is_not_unpickled(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
):
    _, weights = tiny_llama(tied=True)
    expected = logits(runner(tmp_path, weights))
    (path,) = prepared_files(tmp_path)
    with safe_open(path, framework="pt") as file:
        names = file.keys()
        tensors = {name: file.get_tensor(name) for name in names}
        metadata = file.metadata()

    class Exploit:
        def __reduce__(self) -> tuple[object, tuple[str]]:
            return (print, ("unpickled",))

    metadata["model"] = base64.b64encode(pickle.dumps(Exploit())).decode()
    save_file(tensors, path, metadata=metadata)
    assert torch.equal(logits(runner(tmp_path, weights)), expected)
    assert "unpickled" not in capsys.readouterr().out


def test_without_a_fingerprint_or_a_folder_nothing_is_prepared(tmp_path: Path):
    config, weights = tiny_llama(tied=True)
    TorchRunner(config, weights, block_tokens=16, cache_budget_mb=1, dtype="bfloat16")
    runner(tmp_path / "off", weights, fingerprint="")  # an empty fingerprint is none too
    assert not (tmp_path / "off").exists()
