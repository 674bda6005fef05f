"""benchmarks/fuzz_api.py's fuzz of every route, on a small fixed-seed budget, against the app on
the fake runner served by uvicorn in this process (generation is instant, so any `max_tokens`
is cheap). Every answer keeps the rules the script's docstring lists; after each route's run
the engine holds no block and its pool and prefix index pass their integrity checks.

    SEMANTIC_FUZZ_EXAMPLES=2000 pytest tests/unit/test_fuzz_api.py   # the long run
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest

from semantic.engine.engine import Engine
from semantic.text.tokenizer import Tokenizer
from tests.benchmark_script import load_benchmark
from tests.e2e.fake_server import fake_engine_server

EXAMPLES = int(os.environ.get("SEMANTIC_FUZZ_EXAMPLES", "10"))
SEED = int(os.environ.get("SEMANTIC_FUZZ_SEED", "20260504"))


fuzz = load_benchmark("fuzz_api")


@pytest.fixture(scope="module")
def server(
    tiny_tokenizer: Tokenizer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Any, Engine]]:
    cache = tmp_path_factory.mktemp("cache")
    with fake_engine_server(tiny_tokenizer, cache, context=1024, num_blocks=256) as (url, engine):
        target = fuzz.Target(url)
        yield target, engine
        target.close()


@pytest.mark.parametrize("route", fuzz.ROUTES, ids=lambda route: route.name)
def test_fuzzed_requests_keep_every_rule_and_leak_no_block(
    route: Any, server: tuple[Any, Engine]
) -> None:
    target, engine = server
    fuzz.fuzz_route(target, route, EXAMPLES, SEED)
    assert fuzz.server_problems(target) == []
    engine.pool.check_integrity()  # the engine is idle (server_problems saw it): read from here
    engine.prefix.check_integrity()
