"""`semantic bench`: the multi-agent, multi-turn benchmark of any OpenAI-compatible server, with
the same model through `transformers` `generate()` as its baseline (`run.run_bench`). The package
imports nothing itself: the CLI builds its parser from `bench.cli` on every start."""
