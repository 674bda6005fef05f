"""The engine over vLLM replicas, through semantic's whole app, against fake replicas
(`fake_vllm.py`): what a replica receives (our template's token ids, each key's `cache_salt`),
what clients get back through both SDKs, each agent's turns staying on one replica, a replica
that goes down taken out with only its own agents moving, and the routes the engine cannot
serve answering 501 in their protocol's shape."""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import json
import re
import time
from collections.abc import AsyncGenerator, Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import anthropic
import llguidance
import openai
import pytest
from anthropic.types import ToolUseBlock
from fastapi.testclient import TestClient

from semantic.api.app import create_app
from semantic.core import Request, SamplingParams
from semantic.models.served import ServedModel
from semantic.observability import VLLM_METRICS
from semantic.replicas import client as client_module
from semantic.replicas.client import SLOW_CHECKS_TOLERATED, _chunks, _samples, completion_body
from semantic.replicas.engine import ReplicaEngine
from semantic.replicas.router import NoReplica, Router, routing_key
from semantic.server_key import ServerKey
from semantic.settings.settings import Settings
from semantic.text.grammar import CallShape, Opening, ToolCallForm
from tests.unit.fake_vllm import FakeNetwork, FakeReplica
from tests.unit.test_agent_owners import ALICE_KEY, BOB_KEY, as_
from tests.unit.test_metrics import family_names, scrape, value

pytestmark = pytest.mark.usefixtures("no_outside_settings")

ANSWER = "Hello there"
USER = [{"role": "user", "content": "Say hello."}]
SDK_USER: Any = USER  # as the SDKs' typed parameters take it


@contextmanager
def replicas_app(
    served: ServedModel, cache_dir: Path, count: int = 2, **settings: Any
) -> Iterator[tuple[TestClient, ReplicaEngine, FakeNetwork]]:
    """semantic's app over `count` fake replicas, each answering `ANSWER`."""
    reply = [*served.tokenizer.encode(ANSWER), min(served.tokenizer.eos_token_ids)]
    replicas = [FakeReplica(f"http://replica-{i}:8000", reply) for i in range(count)]
    with FakeNetwork(replicas) as network, _app_over(served, cache_dir, network, settings) as app:
        yield app


@contextmanager
def _app_over(
    served: ServedModel, cache_dir: Path, network: FakeNetwork, settings: dict[str, Any]
) -> Iterator[tuple[TestClient, ReplicaEngine, FakeNetwork]]:
    config = Settings(
        engine="vllm", vllm_url=list(network.replicas), cache_dir=cache_dir, **settings
    )
    engine = ReplicaEngine(
        served,
        Router(config.vllm_url, config.vllm_spill_in_flight),
        ServerKey(cache_dir),
        share_across_keys=config.share_cache_across_keys,
        health_interval_s=0.02,
        opener=network.open,
    )
    with TestClient(create_app(engine, config)) as client:
        wait_until(lambda: engine.alive)  # each replica's first check
        wait_until(lambda: all(r.healthy for r in engine.router.replicas))
        yield client, engine, network


def rendered(served: ServedModel, messages: list[dict[str, Any]]) -> list[int]:
    return served.tokenizer.encode(served.chat_template.render(messages))


def wait_until(condition: Callable[[], bool], seconds: float = 60.0) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def chat(client: TestClient, agent: str | None = None, key: str = ALICE_KEY, **body: Any) -> Any:
    request: dict[str, Any] = {"model": "tiny", "max_tokens": 8, "messages": USER} | body
    if agent is not None:
        request["session_id"] = agent
    response = client.post("/v1/chat/completions", json=request, headers=as_(key))
    assert response.status_code == 200, response.text
    return response.json()


def only_received(network: FakeNetwork) -> dict[str, Any]:
    bodies = [body for replica in network.replicas.values() for body in replica.received]
    assert len(bodies) == 1
    return bodies[0]


# -- what a replica receives, and what comes back ------------------------------------------------


def test_an_anthropic_sdk_request_reaches_a_replica_as_our_templates_token_ids(
    chat_served: ServedModel, tmp_path: Path
) -> None:
    with replicas_app(chat_served, tmp_path) as (client, _, network):
        sdk = anthropic.Anthropic(base_url=str(client.base_url), api_key="k", http_client=client)
        message = sdk.messages.create(model="claude-x", max_tokens=8, messages=USER)  # type: ignore[arg-type]
    assert message.content[0].text == ANSWER  # type: ignore[union-attr]
    assert message.stop_reason == "end_turn"
    body = only_received(network)
    assert body["prompt"] == rendered(chat_served, USER)
    assert body["model"] == "served-by-vllm" and body["stream"] and body["return_token_ids"]
    assert body["max_tokens"] == 8
    assert "cache_salt" not in body  # a server without keys is one tenant


def test_an_openai_sdk_stream_gets_the_replicas_answer_and_usage(
    chat_served: ServedModel, tmp_path: Path
) -> None:
    with replicas_app(chat_served, tmp_path) as (client, _, network):
        sdk = openai.OpenAI(base_url=f"{client.base_url}/v1", api_key="k", http_client=client)
        chunks = list(
            sdk.chat.completions.create(
                model="gpt-x",
                messages=SDK_USER,
                max_tokens=8,
                temperature=0.5,
                top_p=0.9,
                stop=["never"],
                seed=7,
                stream=True,
                stream_options={"include_usage": True},
            )
        )
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == ANSWER
    assert chunks[-1].usage is not None
    assert chunks[-1].usage.prompt_tokens == len(rendered(chat_served, USER))
    body = only_received(network)
    assert body["prompt"] == rendered(chat_served, USER)
    assert (body["temperature"], body["top_p"], body["seed"]) == (0.5, 0.9, 7)
    assert body["stop"] == ["never"]
    assert set(chat_served.tokenizer.eos_token_ids) <= set(body["stop_token_ids"])


def test_each_key_gets_its_own_cache_salt_and_its_own_cached_tokens(
    chat_served: ServedModel, tmp_path: Path
) -> None:
    keys = {"api_key": [ALICE_KEY, BOB_KEY]}
    with replicas_app(chat_served, tmp_path, count=1, **keys) as (client, _, network):
        assert chat(client)["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
        warm = chat(client)["usage"]["prompt_tokens_details"]["cached_tokens"]
        assert warm == len(rendered(chat_served, USER))  # the same key's prompt: a hit
        other = chat(client, key=BOB_KEY)["usage"]["prompt_tokens_details"]["cached_tokens"]
        assert other == 0  # the other key's namespace holds nothing of Alice's
    salts = [body["cache_salt"] for body in network.replicas["http://replica-0:8000"].received]
    assert salts[0] == salts[1] != salts[2]
    assert ALICE_KEY not in salts[0]


def test_a_keys_salt_is_keyed_by_the_servers_secret_and_outlives_a_restart(
    chat_served: ServedModel, tmp_path: Path
) -> None:
    keys = {"api_key": [ALICE_KEY, BOB_KEY]}

    def salts(cache_dir: Path) -> tuple[str, str]:
        with replicas_app(chat_served, cache_dir, count=1, **keys) as (client, _, network):
            chat(client)
            chat(client, key=BOB_KEY)
        alice, bob = (b["cache_salt"] for b in network.replicas["http://replica-0:8000"].received)
        return alice, bob

    alice, bob = salts(tmp_path / "server")
    assert alice != bob
    assert salts(tmp_path / "server") == (alice, bob)  # the same secret, read again: same salts
    assert salts(tmp_path / "another")[0] != alice  # another server's secret: another salt
    owner = hashlib.sha256(ALICE_KEY.encode()).hexdigest()[:32]  # Alice's owner digest
    plain = {
        owner,
        hashlib.sha256(owner.encode()).hexdigest()[:32],
        hashlib.blake2b(f"semantic\0{owner}".encode(), digest_size=16).hexdigest(),
    }
    assert alice not in plain  # nobody without the secret computes it from the owner


def test_keys_that_share_the_cache_send_no_salt(chat_served: ServedModel, tmp_path: Path) -> None:
    settings = {"api_key": [ALICE_KEY, BOB_KEY], "share_cache_across_keys": True}
    with replicas_app(chat_served, tmp_path, count=1, **settings) as (client, _, network):
        chat(client)
    assert "cache_salt" not in only_received(network)


def test_the_answers_text_stops_at_a_stop_string_as_on_our_engine(
    chat_served: ServedModel, tmp_path: Path
) -> None:
    with replicas_app(chat_served, tmp_path, count=1) as (client, _, _):
        chat(client, stop=[" there"])
        answer = chat(client, stop=[" there"])
    assert answer["choices"][0]["message"]["content"] == "Hello"
    assert answer["choices"][0]["finish_reason"] == "stop"
    # the replica's usage still arrives after the stop string: the prompt was cached
    assert answer["usage"]["prompt_tokens_details"]["cached_tokens"] > 0


def test_a_replicas_refusal_is_the_clients_error_in_its_protocols_shape(
    chat_served: ServedModel, tmp_path: Path
) -> None:
    with replicas_app(chat_served, tmp_path, count=1) as (client, _, network):
        network.replicas["http://replica-0:8000"].refuse = 400
        response = client.post(
            "/v1/messages", json={"model": "m", "max_tokens": 8, "messages": USER}
        )
    assert response.status_code == 400
    assert response.json()["error"]["type"] == "invalid_request_error"
    assert "the replica says no" in response.json()["error"]["message"]


# -- routing -------------------------------------------------------------------------------------


def test_each_agents_turns_land_on_one_replica(chat_served: ServedModel, tmp_path: Path) -> None:
    agents = [f"agent-{i}" for i in range(8)]
    with replicas_app(chat_served, tmp_path, count=3) as (client, _, network):
        for turn in range(3):
            for agent in agents:
                chat(client, agent, messages=conversation(agent, turn))
    homes = served_where(chat_served, network)
    assert sorted(homes) == agents
    assert all(len(urls) == 3 and len(set(urls)) == 1 for urls in homes.values())
    assert len({urls[0] for urls in homes.values()}) > 1  # spread over the replicas


def test_branches_of_a_responses_chain_go_where_the_chain_is(
    chat_served: ServedModel, tmp_path: Path
) -> None:
    with replicas_app(chat_served, tmp_path, count=3) as (client, _, network):
        first = client.post("/v1/responses", json=responses_turn("Hi.")).json()
        before = {url: len(r.received) for url, r in network.replicas.items()}
        for question in ("Left?", "Right?", "Up?", "Down?"):  # four forks of the first turn
            branch = responses_turn(question, previous_response_id=first["id"])
            assert client.post("/v1/responses", json=branch).status_code == 200
    forks = {url: len(r.received) - before[url] for url, r in network.replicas.items()}
    assert sorted(forks.values()) == [0, 0, 4]


def responses_turn(text: str, **body: Any) -> dict[str, Any]:
    return {"model": "m", "input": text, "max_output_tokens": 8} | body


def test_a_replica_that_goes_down_mid_run_moves_only_its_own_agents(
    chat_served: ServedModel, tmp_path: Path
) -> None:
    agents = [f"agent-{i}" for i in range(8)]
    with replicas_app(chat_served, tmp_path, count=3) as (client, engine, network):
        for agent in agents:
            chat(client, agent, messages=conversation(agent, 0))
        first = {agent: urls[0] for agent, urls in served_where(chat_served, network).items()}
        victim = first[agents[0]]
        network.kill(victim)  # killed: connections refused, /health unanswered
        for turn in (1, 2):  # the first request to it is retried on the next replica
            for agent in agents:
                chat(client, agent, messages=conversation(agent, turn))
        wait_until(lambda: not _replica(engine, victim).healthy)
        ready = client.get("/health/ready")
    homes = served_where(chat_served, network)
    for agent in agents:
        later = homes[agent][1:]
        if first[agent] == victim:
            assert len(set(later)) == 1 and later[0] != victim  # re-homed, and sticky there
        else:
            assert later == [first[agent]] * 2  # the others stay where their cache is
    assert ready.status_code == 200
    assert {r["url"]: r["healthy"] for r in ready.json()["replicas"]}[victim] is False


def conversation(agent: str, turns: int) -> list[dict[str, Any]]:
    """An agent's prompt after `turns` earlier turns: its first message names it."""
    later = [{"role": "assistant", "content": ANSWER}, {"role": "user", "content": "More."}]
    return [{"role": "user", "content": f"I am {agent}."}, *later * turns]


def served_where(served: ServedModel, network: FakeNetwork) -> dict[str, list[str]]:
    """Each agent's requests' replicas, in the order each replica received them (by agent:
    its turns, in order)."""
    homes: dict[str, list[tuple[int, str]]] = {}
    for url, replica in network.replicas.items():
        for body in replica.received:
            agent = re.search(r"agent-\d+", served.tokenizer.decode(body["prompt"]))
            assert agent is not None
            homes.setdefault(agent.group(), []).append((len(body["prompt"]), url))
    return {agent: [url for _, url in sorted(turns)] for agent, turns in homes.items()}


def test_an_answer_cut_off_mid_stream_fails_alone(chat_served: ServedModel, tmp_path: Path) -> None:
    with replicas_app(chat_served, tmp_path, count=2) as (client, engine, network):
        home = _home(engine, "cut")
        network.replicas[home].cut_after = 2  # two tokens, then the connection drops
        request = {"model": "m", "max_tokens": 8, "messages": USER, "session_id": "cut"}
        cut = client.post("/v1/chat/completions", json=request)
        network.replicas[home].cut_after = None
        others = [chat(client, f"other-{i}") for i in range(4)]
    assert cut.status_code == 503 and cut.json()["error"]["code"] == "unavailable"
    assert "mid-answer" in cut.json()["error"]["message"]
    assert all(answer["choices"][0]["message"]["content"] == ANSWER for answer in others)


@pytest.mark.parametrize(
    ("route", "agent_field"),
    [
        ("/v1/chat/completions", {"session_id": "cut"}),
        ("/v1/messages", {"metadata": {"user_id": "cut"}}),
    ],
)
def test_a_stream_cut_off_by_a_killed_replica_ends_in_its_protocols_error_and_the_agent_moves(
    chat_served: ServedModel, tmp_path: Path, route: str, agent_field: dict[str, Any]
) -> None:
    with replicas_app(chat_served, tmp_path, count=2) as (client, engine, network):
        home = _home(engine, "cut")
        network.replicas[home].cut_after = 2  # two tokens, then the replica is killed
        request = {"model": "m", "max_tokens": 8, "messages": USER} | agent_field
        cut = client.post(route, json=request | {"stream": True})
        network.kill(home)
        next_turn = client.post(route, json=request)
    assert cut.status_code == 200  # the 200 went with the first bytes: the error is an event
    last = json.loads(cut.text.strip().split("\n")[-1].removeprefix("data:"))
    error = last["error"]
    assert "mid-answer" in error["message"] and "Traceback" not in cut.text
    assert error.get("code") == "unavailable" or last["type"] == "error"  # OpenAI's, Anthropic's
    assert next_turn.status_code == 200
    (other,) = set(network.replicas) - {home}
    assert len(network.replicas[other].received) == 1  # the agent's next turn, on the other


def test_a_replica_that_comes_back_gets_its_agents_back(
    chat_served: ServedModel, tmp_path: Path
) -> None:
    with replicas_app(chat_served, tmp_path, count=2) as (client, engine, network):
        home = _home(engine, "returner")
        network.replicas[home].healthy = False
        wait_until(lambda: _home(engine, "returner") != home)
        network.replicas[home].healthy = True
        wait_until(lambda: _home(engine, "returner") == home)
        chat(client, "returner")
    assert len(network.replicas[home].received) == 1


def test_health_is_503_when_every_replica_is_down(chat_served: ServedModel, tmp_path: Path) -> None:
    with replicas_app(chat_served, tmp_path, count=2) as (client, engine, network):
        assert client.get("/health/ready").status_code == 200
        for replica in network.replicas.values():
            replica.healthy = False
        wait_until(lambda: not engine.alive)
        ready = client.get("/health/ready")
        refused = client.post(
            "/v1/chat/completions", json={"model": "m", "max_tokens": 4, "messages": USER}
        )
    assert ready.status_code == 503 and ready.json()["reason"] == "no vLLM replica is healthy"
    assert refused.status_code == 503


def test_load_spills_to_the_least_loaded_replica_past_the_threshold() -> None:
    router = Router(["http://a", "http://b", "http://c"], spill_in_flight=2)
    for replica in router.replicas:
        router.mark(replica, True)
    home = router.route("k")
    router.route("k")
    spilled = router.route("k")  # the home has 2 in flight: the next goes elsewhere
    assert spilled is not home and spilled.spilled == 1
    router.done(spilled)
    assert home.in_flight == 2


def test_an_anonymous_conversation_is_routed_by_its_opening_tokens() -> None:
    sampling = SamplingParams()
    first = Request("r1", list(range(300)), sampling, owner="o")
    later = Request("r2", [*range(300), 7, 7, 7], sampling, owner="o")
    other_owner = Request("r3", list(range(300)), sampling, owner="p")
    assert routing_key(first) == routing_key(later) != routing_key(other_owner)
    named = Request("r4", [1], sampling, agent_id="a", owner="o")
    assert routing_key(named) == routing_key(
        Request("r5", [2, 3], sampling, agent_id="a", owner="o")
    )


def test_the_body_maps_our_sampling_onto_vllms_fields() -> None:
    sampling = SamplingParams(temperature=0.0, top_k=0, max_tokens=5, min_tokens=2, ignore_eos=True)
    body = completion_body(Request("r", [5, 6], sampling), "m", "salt", frozenset({9}))
    assert body["prompt"] == [5, 6] and body["cache_salt"] == "salt"
    assert (body["temperature"], body["top_k"], body["min_tokens"]) == (0.0, -1, 2)
    assert "stop_token_ids" not in body  # ignore_eos: the end tokens do not stop it


# -- what the engine cannot serve ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("method", "path", "body"),
    [
        ("POST", "/v1/agents", {}),
        ("GET", "/v1/agents", None),
        ("PATCH", "/v1/agents/a1", {"pinned": True}),
        ("POST", "/v1/agents/a1/generate", {"message": "hi"}),
        ("POST", "/v1/agents/a1/fork", {}),
        ("DELETE", "/v1/agents/a1", None),
        ("GET", "/admin/cache", None),
        ("POST", "/admin/cache/evict", {}),
        ("POST", "/admin/cache/persist", {}),
        ("POST", "/admin/models/swap", {"model": "smollm2-135m"}),
        ("POST", "/v1/chat/completions", {"model": "m", "messages": USER, "logprobs": True}),
        ("POST", "/v1/completions", {"model": "m", "prompt": "Hi", "logprobs": 1}),
        (
            "POST",
            "/v1/responses",
            {"model": "m", "input": "Hi", "include": ["message.output_text.logprobs"]},
        ),
    ],
)
def test_routes_the_vllm_engine_cannot_serve_answer_501(
    chat_served: ServedModel, tmp_path: Path, method: str, path: str, body: Any
) -> None:
    with replicas_app(chat_served, tmp_path, count=1) as (client, _, _):
        response = client.request(method, path, json=body)
    assert response.status_code == 501, response.text
    error = response.json()["error"]
    assert "not available" in error["message"]
    assert error.get("code", "not_supported") == "not_supported"


def _home(engine: ReplicaEngine, agent: str) -> str:
    return engine.router.home(routing_key(Request("r", [1], SamplingParams(), agent_id=agent))).url


def _replica(engine: ReplicaEngine, url: str) -> Any:
    return next(r for r in engine.router.replicas if r.url == url)


# -- structured output ---------------------------------------------------------------------------

SCHEMA: Any = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
TOOLS: Any = [
    {"name": "get_weather", "description": "Current weather", "input_schema": SCHEMA},
    {"name": "get_time", "description": "Current time", "input_schema": {"type": "object"}},
]
ASK: Any = [{"role": "user", "content": "Weather in Paris?"}]


def answering(network: FakeNetwork, served: ServedModel, text: str) -> None:
    """Every replica answers `text` (then the end token) from now on."""
    for replica in network.replicas.values():
        replica.reply = [*served.tokenizer.encode(text), min(served.tokenizer.eos_token_ids)]


@pytest.fixture
def tool_served(chat_served: ServedModel) -> ServedModel:
    """`chat_served` with room for the default tool prompt (~450 of its tokens)."""
    return dataclasses.replace(chat_served, context_length=2048)


def test_a_json_schema_response_format_reaches_the_replica_as_its_schema(
    chat_served: ServedModel, tmp_path: Path
) -> None:
    with replicas_app(chat_served, tmp_path, count=1) as (client, _, network):
        answering(network, chat_served, '{"city": "Paris"}')
        sdk = openai.OpenAI(base_url=f"{client.base_url}/v1", api_key="k", http_client=client)
        answer = sdk.chat.completions.create(
            model="gpt-x",
            messages=SDK_USER,
            max_tokens=30,
            response_format={
                "type": "json_schema",
                "json_schema": {"name": "place", "schema": SCHEMA, "strict": True},
            },
        )
        chat(client, response_format={"type": "json_object"})
    assert json.loads(answer.choices[0].message.content or "") == {"city": "Paris"}
    schema_body, object_body = network.replicas["http://replica-0:8000"].received
    assert schema_body["structured_outputs"] == {"json": SCHEMA}
    assert object_body["structured_outputs"]["json"] == {"type": "object"}


@pytest.mark.parametrize(
    ("path", "body"),
    [
        (
            "/v1/responses",
            {
                "input": "Where?",
                "text": {"format": {"type": "json_schema", "name": "p", "schema": SCHEMA}},
            },
        ),
        (
            "/v1/messages",
            {
                "messages": USER,
                "output_config": {"format": {"type": "json_schema", "schema": SCHEMA}},
            },
        ),
    ],
)
def test_every_apis_json_schema_field_reaches_the_replica(
    chat_served: ServedModel, tmp_path: Path, path: str, body: dict[str, Any]
) -> None:
    with replicas_app(chat_served, tmp_path, count=1) as (client, _, network):
        answering(network, chat_served, '{"city": "Paris"}')
        response = client.post(path, json={"model": "m", "max_tokens": 30} | body)
    assert response.status_code == 200, response.text
    assert json.dumps('{"city": "Paris"}')[1:-1] in response.text  # the answer, as a string
    assert only_received(network)["structured_outputs"] == {"json": SCHEMA}


def test_a_forced_tool_call_goes_as_our_grammar_and_is_parsed_from_the_returned_ids(
    tool_served: ServedModel, tmp_path: Path
) -> None:
    named: Any = {"type": "tool", "name": "get_weather", "disable_parallel_tool_use": True}
    with replicas_app(tool_served, tmp_path, count=1) as (client, _, network):
        answering(network, tool_served, '{"city": "Paris"}}\n</tool_call>')
        sdk = anthropic.Anthropic(base_url=str(client.base_url), api_key="k", http_client=client)
        message = sdk.messages.create(
            model="claude-x",
            max_tokens=60,
            messages=ASK,
            tools=TOOLS,
            tool_choice=named,
        )
    assert message.stop_reason == "tool_use"
    calls = [(b.name, b.input) for b in message.content if isinstance(b, ToolUseBlock)]
    assert calls == [("get_weather", {"city": "Paris"})]
    assert len(message.content) == 1
    body = only_received(network)
    prompt = tool_served.tokenizer.decode(body["prompt"], skip_special_tokens=False)
    assert prompt.endswith('<tool_call>\n{"name": "get_weather", "arguments": ')  # prefilled
    grammar = body["structured_outputs"]["grammar"]
    assert grammar.startswith("start: ") and "%json" in grammar and '"city"' in grammar
    assert "get_time" not in grammar  # the named tool's arguments, and nothing after the call


def test_a_forced_call_that_more_calls_may_follow_is_held_up_to_its_end_then_free(
    tool_served: ServedModel, tmp_path: Path
) -> None:
    body = {"model": "gpt-x", "max_tokens": 60, "messages": ASK, "tool_choice": "required"}
    tools = [
        {"type": "function", "function": {"name": t["name"], "parameters": t["input_schema"]}}
        for t in TOOLS
    ]
    with replicas_app(tool_served, tmp_path, count=1) as (client, _, network):
        answering(
            network, tool_served, 'get_time", "arguments": {}}\n</tool_call>'
        )  # after the opener
        answer = chat(client, **body | {"tools": tools})
    assert answer["choices"][0]["message"]["tool_calls"][0]["function"]["name"] == "get_time"
    grammar = only_received(network)["structured_outputs"]["grammar"]
    # either tool, then free text: the later calls are read from it, as without a forced call
    assert grammar.startswith("start: first TEXT\n") and "get_time" in grammar
    assert "[lazy]" not in grammar and "later" not in grammar  # what xgrammar cannot compile


@pytest.mark.parametrize("bare", [False, True])  # True: a renamed call, in the model's spacing
def test_a_forced_calls_source_is_a_grammar_of_its_own_without_lazy_rules(
    tool_served: ServedModel, bare: bool
) -> None:
    lead = '{"name": "get_weather", "arguments": '
    opening = Opening("<tool_call>", (CallShape(lead, SCHEMA, True),), "}\n</tool_call>")
    closer = r"\s*\}" if bare else "}\n</tool_call>"
    form = ToolCallForm(closer, (CallShape(lead, SCHEMA, True),), (opening,), forced_bare=bare)
    source = tool_served.grammars.tool_calls(form).source.text
    assert "[lazy]" not in source and ("SPACE:" in source) == bare
    grammars = tool_served.grammars
    vocabulary = llguidance.LLTokenizer(
        tool_served.tokenizer.backend_json(), n_vocab=grammars.vocab_size
    )
    lark = llguidance.LLMatcher.grammar_from_lark(source)
    assert llguidance.LLMatcher.validate_grammar(lark, vocabulary) == ""


def test_tools_without_a_forced_call_send_no_grammar(
    tool_served: ServedModel, tmp_path: Path
) -> None:
    body = {"model": "claude-x", "max_tokens": 60, "messages": ASK, "tools": TOOLS}
    with replicas_app(tool_served, tmp_path, count=1) as (client, _, network):
        answering(
            network, tool_served, '<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>'
        )
        answer = client.post("/v1/messages", json=body).json()
    assert [b["name"] for b in answer["content"] if b["type"] == "tool_use"] == ["get_time"]
    assert "structured_outputs" not in only_received(network)  # the calls are read from the text


def test_a_replica_that_cannot_take_the_grammar_is_a_400_in_the_protocols_shape(
    tool_served: ServedModel, tmp_path: Path
) -> None:
    body = {"model": "gpt-x", "max_tokens": 60, "messages": ASK, "tool_choice": "required"}
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": SCHEMA}}]
    with replicas_app(tool_served, tmp_path, count=1) as (client, _, network):
        network.replicas["http://replica-0:8000"].refuse = 400  # a backend pinned to xgrammar
        response = client.post("/v1/chat/completions", json=body | {"tools": tools})
    assert response.status_code == 400, response.text
    assert "refused" in response.json()["error"]["message"]
    assert "grammar" in only_received(network)["structured_outputs"]


WORD: Any = {"type": "object", "properties": {"word": {"type": "string"}}, "required": ["word"]}
ASKED_FOR_JSON: Any = {
    "/v1/chat/completions": {
        "messages": USER,
        "response_format": {"type": "json_schema", "json_schema": {"name": "w", "schema": WORD}},
    },
    "/v1/messages": {
        "messages": USER,
        "output_config": {"format": {"type": "json_schema", "schema": WORD}},
    },
    "/v1/responses": {
        "input": "Say a word.",
        "text": {"format": {"type": "json_schema", "name": "w", "schema": WORD}},
    },
}


@pytest.mark.parametrize("route", list(ASKED_FOR_JSON))
def test_a_refusal_that_begins_the_replicas_stream_is_a_400_in_the_protocols_shape(
    chat_served: ServedModel, tmp_path: Path, route: str
) -> None:
    grammar_error = 'Grammar error: Unimplemented keys: ["contains"]'
    with replicas_app(chat_served, tmp_path, count=1) as (client, _, network):
        network.replicas["http://replica-0:8000"].fail_first = (400, grammar_error)
        body = {"model": "m", "max_tokens": 30} | ASKED_FOR_JSON[route]
        response = client.post(route, json=body)
        streamed = client.post(route, json=body | {"stream": True})
    assert response.status_code == 400, response.text  # vLLM's 200, then its 400 as an event
    assert response.json()["error"]["type"] == "invalid_request_error"
    assert grammar_error in response.json()["error"]["message"]
    assert streamed.status_code == 200  # the 200 went first: the refusal is the error event
    assert grammar_error.replace('"', '\\"') in streamed.text
    assert "server_error" not in streamed.text and "api_error" not in streamed.text


@pytest.mark.parametrize("route", list(ASKED_FOR_JSON))
def test_a_grammar_the_replica_cannot_compile_is_a_400_and_a_bare_failure_stays_a_500(
    chat_served: ServedModel, tmp_path: Path, route: str
) -> None:
    with replicas_app(chat_served, tmp_path, count=1) as (client, _, network):
        # vLLM 0.32's whole answer to a grammar its backend failed to compile
        network.replicas["http://replica-0:8000"].fail_first = (500, "Internal server error")
        body = {"model": "m", "max_tokens": 30} | ASKED_FOR_JSON[route]
        constrained = client.post(route, json=body)
        plain = client.post(
            "/v1/chat/completions", json={"model": "m", "max_tokens": 8, "messages": USER}
        )
    assert constrained.status_code == 400, constrained.text
    error = constrained.json()["error"]
    assert error["type"] == "invalid_request_error"
    assert "could not compile the request's grammar" in error["message"]
    assert "Internal server error" in error["message"]
    assert plain.status_code == 500  # no grammar: the replica's failure, not the request's
    assert plain.json()["error"]["type"] == "server_error"


def test_the_replicas_max_model_len_bounds_the_prompt_and_the_answer(
    chat_served: ServedModel, tmp_path: Path
) -> None:
    long = [{"role": "user", "content": "word " * 120}]
    with replicas_app(chat_served, tmp_path, count=2) as (client, engine, network):
        network.replicas["http://replica-1:8000"].max_model_len = 100  # the shorter one bounds
        for replica in engine.router.replicas:
            replica.model_id = None  # read /v1/models again
        wait_until(lambda: engine.router.replicas[1].max_model_len == 100)
        models = client.get("/v1/models").json()["data"][0]
        too_long = client.post(
            "/v1/messages", json={"model": "m", "max_tokens": 8, "messages": long}
        )
        asked = {"model": "m", "max_tokens": 400, "messages": USER}
        answered = client.post("/v1/messages", json=asked)
        too_much = client.post("/v1/chat/completions", json=asked)
    assert models["max_model_len"] == 100
    assert too_long.status_code == 400  # ours, before any replica: the wording Claude Code
    assert too_long.json()["error"]["message"].startswith("prompt is too long")  # compacts on
    assert answered.status_code == 200, answered.text  # Anthropic's max_tokens is a ceiling:
    body = only_received(network)
    assert len(body["prompt"]) + body["max_tokens"] == 100  # cut to the room the replica has
    assert too_much.json()["error"]["code"] == "context_length_exceeded"  # OpenAI's is not


# -- metrics -------------------------------------------------------------------------------------

DOCS = Path(__file__).parents[2] / "docs"


def test_metrics_count_requests_tokens_and_each_replicas_health_and_load(
    chat_served: ServedModel, tmp_path: Path
) -> None:
    prompt = rendered(chat_served, USER)
    reply = len(chat_served.tokenizer.encode(ANSWER)) + 1  # and the end token
    with replicas_app(chat_served, tmp_path) as (client, engine, network):
        chat(client, "a1")
        chat(client, "a1")
        home, other = (
            _home(engine, "a1"),
            next(u for u in network.replicas if u != _home(engine, "a1")),
        )
        network.replicas[home].waiting = 3
        samples = scrape(client)
        network.kill(other)
        wait_until(lambda: not _replica(engine, other).healthy)
        after = scrape(client)
        network.kill(home)
        wait_until(lambda: not engine.alive)
        down = scrape(client)
    assert (
        value(samples, "semantic_requests_total", route="/v1/chat/completions", status="200") == 2
    )
    assert value(samples, "semantic_time_to_first_token_seconds_count") == 2
    assert value(samples, "semantic_generated_tokens_total") == 2 * reply
    assert value(samples, "semantic_cache_hit_tokens_total", tier="memory") == len(prompt)
    assert value(samples, "semantic_cache_miss_tokens_total") == len(prompt)
    assert value(samples, "semantic_model_info", model=chat_served.name) == 1
    assert value(samples, "semantic_requests_running") == 0
    assert value(samples, "semantic_requests_waiting") == 3  # the replicas' own queues
    for url in network.replicas:
        assert value(samples, "semantic_replica_healthy", replica=url) == 1
        assert value(samples, "semantic_replica_in_flight", replica=url) == 0
        routed = 2 if url == home else 0
        assert value(samples, "semantic_replica_routed_requests_total", replica=url) == routed
        assert value(samples, "semantic_replica_spilled_requests_total", replica=url) == 0
    # what the home replica's own /metrics said
    hit = value(samples, "semantic_replica_prefix_cache_tokens_total", replica=home, outcome="hit")
    queried = value(
        samples, "semantic_replica_prefix_cache_tokens_total", replica=home, outcome="queried"
    )
    assert (hit, queried) == (len(prompt), 2 * len(prompt))
    assert value(samples, "semantic_replica_requests", replica=home, state="waiting") == 3
    assert value(samples, "semantic_replica_kv_cache_usage_ratio", replica=home) == 0.25
    # a replica out of the routing: unhealthy, and not asked for its /metrics
    assert value(after, "semantic_replica_healthy", replica=other) == 0
    assert ("semantic_replica_kv_cache_usage_ratio", frozenset({("replica", other)})) not in after
    # every replica down: still shown, as down
    assert [value(down, "semantic_replica_healthy", replica=url) for url in network.replicas] == [
        0,
        0,
    ]
    documented = [
        *re.findall(r"`(semantic_\w+)`", (DOCS / "operations.md").read_text()),
        *re.findall(r"`(semantic_\w+)`", (DOCS / "scale-out.md").read_text()),
    ]
    exposed = family_names(name for name, _ in samples if name.startswith("semantic_"))
    assert exposed <= family_names(documented)


def test_a_replicas_metrics_are_read_by_name_summed_over_their_labels() -> None:
    text = "\n".join(
        [
            "# HELP vllm:num_requests_waiting Number of requests waiting.",
            'vllm:num_requests_waiting{engine="0",model_name="m"} 2.0',
            'vllm:num_requests_waiting{engine="1",model_name="m x}"} 3.0 1700000000',
            'vllm:prefix_cache_hits_created{engine="0"} 1.7e9',
            "vllm:prefix_cache_hits_total 40",
            "vllm:num_requests_running{broken",
            "vllm:num_requests_running not-a-number",
        ]
    )
    names = {n: n.split(":")[1] for n in VLLM_METRICS}
    assert _samples(text, names) == {"num_requests_waiting": 5.0, "prefix_cache_hits_total": 40.0}


class _Parts:
    """A response body in the given parts, remembering how many were read."""

    def __init__(self, parts: list[bytes]) -> None:
        self.parts = parts
        self.read = 0

    async def body(self) -> AsyncGenerator[bytes, None]:
        for part in self.parts:
            self.read += 1
            yield part


def test_a_stream_is_read_to_its_end_its_events_whole_however_it_was_split() -> None:
    """Events split across reads come whole, and what follows `[DONE]` (the end of the chunked
    body) is read too, so the connection goes back to the pool instead of being closed."""
    first = {"choices": [{"index": 0, "token_ids": [7, 8], "finish_reason": None}]}
    last = {"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 2}}
    sse = f"data: {json.dumps(first)}\n\ndata: {json.dumps(last)}\n\ndata: [DONE]\n\n".encode()
    stream = _Parts([sse[:9], sse[9:40], sse[40:-8], sse[-8:], b""])

    async def chunks() -> list[dict[str, Any]]:
        return [chunk async for chunk in _chunks(stream.body())]

    assert asyncio.run(chunks()) == [first, last]
    assert stream.read == len(stream.parts)


def test_a_replica_whose_health_check_only_times_out_stays_for_a_few_checks(
    chat_served: ServedModel, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A busy replica (vLLM answers /health on the loop that compiles a grammar) keeps its
    agents for a few slow checks in a row; past that it is taken out like a dead one, and it
    joins again once it answers."""
    monkeypatch.setattr(client_module, "HEALTH_TIMEOUT_S", 0.1)  # a slow check's wait
    network = FakeNetwork([FakeReplica("http://replica-0:8000", [1])])
    router = Router(list(network.replicas), spill_in_flight=2)
    engine = ReplicaEngine(
        chat_served, router, ServerKey(tmp_path), health_interval_s=3600, opener=network.open
    )
    (replica,) = router.replicas

    async def checks() -> list[bool]:
        engine.start()  # its watcher's first round, then an hour's sleep: the checks are ours
        await asyncio.sleep(0)
        await engine._check(replica)
        states = [replica.healthy]
        network.busy.add(replica.url)
        for _ in range(SLOW_CHECKS_TOLERATED):
            await engine._check(replica)
            states.append(replica.healthy)
        network.busy.discard(replica.url)
        await engine._check(replica)
        states.append(replica.healthy)
        engine.stop()
        return states

    with network:
        states = asyncio.run(checks())
    assert states == [True] + [True] * (SLOW_CHECKS_TOLERATED - 1) + [False, True]


def test_a_replica_joins_the_routing_once_its_model_and_length_are_read() -> None:
    router = Router(["http://a"], spill_in_flight=2)
    with pytest.raises(NoReplica):
        router.route("k")  # not yet checked: its --max-model-len is unknown


@pytest.mark.parametrize("how", ["closed", "aborted"])
def test_a_request_left_mid_answer_closes_the_replicas_stream(
    chat_served: ServedModel, tmp_path: Path, how: str
) -> None:
    """A client gone mid-answer (its stream closed) or a request aborted: the replica's stream
    is closed before its end (vLLM aborts the request on that), and the engine keeps no task."""
    slow = FakeReplica("http://replica-0:8000", list(range(100, 400)), token_interval_s=0.01)
    network = FakeNetwork([slow])
    router = Router(list(network.replicas), spill_in_flight=2)
    engine = ReplicaEngine(
        chat_served, router, ServerKey(tmp_path), health_interval_s=3600, opener=network.open
    )
    sampling = SamplingParams(max_tokens=300, ignore_eos=True)

    async def leave() -> int:
        engine.start()
        await engine._check(router.replicas[0])  # healthy, its model read
        events = engine.stream(Request("r1", [1, 2, 3], sampling))
        first = await anext(events)
        if how == "aborted":
            engine.abort("r1")
            while not (await anext(events)).final:
                pass
        await events.aclose()  # type: ignore[attr-defined]
        running = len(engine._tasks)
        engine.stop()
        return len(first.token_ids) + running

    with network:
        assert asyncio.run(leave()) == 1  # one token read, no task left
        wait_until(lambda: slow.abandoned == 1)
    assert len(slow.received) == 1
