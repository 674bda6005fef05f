"""`semantic bench`: the multi-agent, multi-turn benchmark of any OpenAI-compatible server, with
the same model through `transformers` `generate()` as its baseline (`run.run_bench`).

A client of the server, so a package beside it, not inside it: it uses the server's settings
parser (to start a `semantic serve` of its own) and its model registry (for the baseline), and
nothing in `semantic` imports it but the `semantic bench` verb (`semantic/commands/bench.py`).
It ships in the same distribution, so the verb works from an installed wheel. The package
imports nothing itself: the CLI builds its parser from `cli.py` on every start."""
