"""The `semantic` command's verbs, a module each: `serve.py` (with `preflight.py`, its checks
before the load, and `loader.py`, settings → the engine it serves), `config.py`, `models.py`,
`agents.py` (with `agents_query.py`, which answers it) and `bench.py` (the benchmark client,
`semantic_bench`, behind it).

Each verb module has `add_parser(verbs)`, which adds its parser and flags and sets its handler;
`cli.py` lists the verbs. A verb module imports little itself, since every start builds every
parser: what the verb runs it imports in its handler. The server (`api/`, `engine/` and below)
never imports a command."""
