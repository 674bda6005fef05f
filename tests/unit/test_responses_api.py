"""The OpenAI Responses API over the fake runner, through the `openai` SDK: answers, streams
(parsed by the SDK's own accumulator), chains kept as agents, stored responses and their
owners, function calls, Codex's request shape, and malformed input."""

from __future__ import annotations

import dataclasses
import json
import os
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest
from fastapi.testclient import TestClient

from semantic.api.responses_output import item_id
from semantic.api.responses_store import ResponseStore, StoredResponse
from semantic.core import DefaultSampling
from semantic.errors import NotFound
from semantic.models.served import ServedModel
from semantic.text.tokenizer import Tokenizer
from tests.scripted_runner import ScriptedRunner
from tests.unit.fakes import engine_on, fake_served, running, with_chatml

INSTRUCTIONS = "You answer briefly. " * 20


@pytest.fixture
def served(tiny_tokenizer: Tokenizer) -> ServedModel:
    return with_chatml(fake_served(tiny_tokenizer, context=4096))


@pytest.fixture
def api(served: ServedModel, tmp_path: Path) -> Iterator[TestClient]:
    with running(served, tmp_path, num_blocks=600) as (client, _, _):
        yield client


def agent_ids(api: TestClient) -> list[str]:
    return [agent["agent_id"] for agent in api.get("/admin/cache").json()["agents"]]


def sdk(api: TestClient) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{api.base_url}/v1", api_key="any", http_client=api)


def test_a_text_input_gets_a_completed_response_with_usage(api: TestClient) -> None:
    response = sdk(api).responses.create(
        model="gpt-5-codex", input="Hello", instructions="Be brief.", max_output_tokens=8
    )
    assert response.id.startswith("resp_") and response.object == "response"
    assert response.model == "gpt-5-codex"
    assert response.status == "incomplete"  # the fake model never ends on its own
    assert response.incomplete_details is not None
    assert response.incomplete_details.reason == "max_output_tokens"
    assert response.output[0].type == "message" and response.output_text
    assert response.usage is not None and response.usage.output_tokens == 8
    assert response.usage.input_tokens > 0


def test_a_chain_reads_its_history_from_the_cache(api: TestClient) -> None:
    client = sdk(api)
    first = client.responses.create(
        model="m", input="Hello", instructions=INSTRUCTIONS, max_output_tokens=8
    )
    second = client.responses.create(
        model="m",
        input="And then?",
        instructions=INSTRUCTIONS,
        previous_response_id=first.id,
        max_output_tokens=8,
    )
    third = client.responses.create(
        model="m",
        input="Go on.",
        instructions=INSTRUCTIONS,
        previous_response_id=second.id,
        max_output_tokens=8,
    )
    assert third.usage is not None
    cached = third.usage.input_tokens_details.cached_tokens
    assert cached >= 0.9 * third.usage.input_tokens
    assert agent_ids(api) == [first.id]  # the chain is one agent, named after its first response


def test_one_shot_stored_responses_stay_one_offs_so_side_requests_find_room(
    served: ServedModel, tmp_path: Path
) -> None:
    """The API stores every response by default: a burst of one-shot calls filling the pool
    must not pass for working agents, whose caches a side request may not evict while anything
    runs. The chain becomes an agent once a response continues it."""
    with running(served, tmp_path, num_blocks=40, queue_timeout_s=2) as (client, _, _):
        api = sdk(client)
        first = api.responses.create(model="m", input="Hello there. " * 8, max_output_tokens=8)
        for n in range(12):
            api.responses.create(model="m", input=f"Question {n}. " * 8, max_output_tokens=8)
        assert agent_ids(client) == []
        side = [{"role": "user", "content": "A side question. " * 8}]
        body = {"model": "m", "messages": side, "max_tokens": 8}
        assert client.post("/v1/chat/completions", json=body).status_code == 200
        api.responses.create(
            model="m", input="And then?", previous_response_id=first.id, max_output_tokens=8
        )
        assert agent_ids(client) == [first.id]


def test_a_stream_is_put_together_by_the_sdk_accumulator(
    served: ServedModel, tmp_path: Path
) -> None:
    client, runner = scripted(served, tmp_path)
    runner.say(served.tokenizer.encode("Hello there, friend."))
    with client, sdk(client).responses.stream(model="m", input="Hello") as stream:
        kinds = [event.type for event in stream]
        final = stream.get_final_response()
    assert kinds[:2] == ["response.created", "response.in_progress"]
    assert kinds[-1] == "response.completed"
    assert "response.output_text.delta" in kinds and "response.output_text.done" in kinds
    assert final.output_text == "Hello there, friend." and final.usage is not None


def test_a_stream_cut_by_max_output_tokens_ends_incomplete(api: TestClient) -> None:
    body = {"model": "m", "input": "Hello", "max_output_tokens": 5, "stream": True}
    with api.stream("POST", "/v1/responses", json=body) as response:
        raw = "".join(response.iter_text())
    events = [json.loads(line[6:]) for line in raw.splitlines() if line.startswith("data: ")]
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    assert events[-1]["type"] == "response.incomplete"
    assert events[-1]["response"]["incomplete_details"] == {"reason": "max_output_tokens"}


def test_a_stored_response_can_be_read_listed_and_deleted(api: TestClient) -> None:
    client = sdk(api)
    items = [
        {"role": "developer", "content": "Be brief."},
        {"role": "user", "content": [{"type": "input_text", "text": "Hi"}]},
    ]
    created = client.responses.create(model="m", input=items, max_output_tokens=4)  # type: ignore[arg-type]
    again = client.responses.retrieve(created.id)
    assert again.id == created.id and again.output_text == created.output_text
    listed = client.responses.input_items.list(created.id, order="asc")
    assert [item.type for item in listed.data] == ["message", "message"]
    deleted = api.delete(f"/v1/responses/{created.id}").json()
    assert deleted == {"id": created.id, "object": "response", "deleted": True}
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(created.id)


def first_text(item: Any) -> str:
    return str(item.content[0].text)


def test_input_items_page_through_the_sdks_pagination(api: TestClient) -> None:
    """Five input items, two a page: the SDK's auto-pagination (`after` the last id) reads
    them all once, newest first by default."""
    client = sdk(api)
    items = [{"role": "user", "content": f"message {n}"} for n in range(5)]
    created = client.responses.create(model="m", input=items, max_output_tokens=4)  # type: ignore[arg-type]
    page = client.responses.input_items.list(created.id, limit=2)
    assert page.has_more and len(page.data) == 2
    texts = [first_text(item) for item in page]
    assert texts == [f"message {n}" for n in (4, 3, 2, 1, 0)]
    last = client.responses.input_items.list(created.id, limit=2, after=page.data[1].id)
    assert len(last.data) == 2 and last.has_more
    ascending = client.responses.input_items.list(created.id, order="asc", limit=100)
    assert [first_text(item) for item in ascending.data] == texts[::-1]
    assert not ascending.has_more


def test_an_unstored_response_cannot_be_continued(api: TestClient) -> None:
    client = sdk(api)
    unstored = client.responses.create(model="m", input="Hi", store=False, max_output_tokens=4)
    with pytest.raises(openai.BadRequestError) as refused:
        client.responses.create(
            model="m", input="More", previous_response_id=unstored.id, max_output_tokens=4
        )
    # OpenAI's answer, which clients (Codex) recover from by sending the whole history
    assert refused.value.code == "previous_response_not_found"
    assert refused.value.body["param"] == "previous_response_id"  # type: ignore[index]


def test_chains_survive_a_restart(served: ServedModel, tmp_path: Path) -> None:
    with running(served, tmp_path, num_blocks=600) as (client, _, _):
        first = sdk(client).responses.create(
            model="m", input="Hello", instructions=INSTRUCTIONS, max_output_tokens=8
        )
    with running(served, tmp_path, num_blocks=600) as (client, _, _):
        second = sdk(client).responses.create(
            model="m",
            input="Again",
            instructions=INSTRUCTIONS,
            previous_response_id=first.id,
            max_output_tokens=8,
        )
    assert second.usage is not None
    assert second.usage.input_tokens_details.cached_tokens >= 0.8 * second.usage.input_tokens


WEATHER_TOOL = {
    "type": "function",
    "name": "get_weather",
    "description": "Weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
}


def scripted(served: ServedModel, tmp_path: Path) -> tuple[TestClient, ScriptedRunner]:
    runner = ScriptedRunner(
        end_token_id=served.tokenizer.token_to_id("<|im_end|>") or 2,
        num_blocks=600,
        block_tokens=8,
        vocab_size=400,
        first_token_id=3,
    )
    engine = engine_on(runner, served, tmp_path)
    from semantic.api.app import create_app

    return TestClient(create_app(engine, engine.settings)), runner


def test_a_function_call_round_trip(served: ServedModel, tmp_path: Path) -> None:
    client, runner = scripted(served, tmp_path)
    call = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
    runner.say(served.tokenizer.encode(call), served.tokenizer.encode("It is sunny."))
    with client:
        api = sdk(client)
        first = api.responses.create(model="m", input="Weather in Paris?", tools=[WEATHER_TOOL])  # type: ignore[list-item]
        (item,) = first.output
        assert item.type == "function_call" and item.name == "get_weather"
        assert json.loads(item.arguments) == {"city": "Paris"}
        output = {"type": "function_call_output", "call_id": item.call_id, "output": "15 C"}
        second = api.responses.create(
            model="m",
            input=[output],  # type: ignore[list-item]
            previous_response_id=first.id,
            tools=[WEATHER_TOOL],  # type: ignore[list-item]
        )
    assert second.output_text == "It is sunny."
    prompt = served.tokenizer.decode([t for t in runner.prompts[-1]], skip_special_tokens=False)
    assert '"city": "Paris"' in prompt and "15 C" in prompt


def test_a_streamed_function_call_is_accumulated_by_the_sdk(
    served: ServedModel, tmp_path: Path
) -> None:
    client, runner = scripted(served, tmp_path)
    call = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>'
    runner.say(served.tokenizer.encode(call))
    with (
        client,
        sdk(client).responses.stream(
            model="m",
            input="Weather?",
            tools=[WEATHER_TOOL],  # type: ignore[list-item]
        ) as stream,
    ):
        kinds = [event.type for event in stream]
        final = stream.get_final_response()
    assert "response.function_call_arguments.delta" in kinds
    (item,) = final.output
    assert item.type == "function_call" and json.loads(item.arguments) == {"city": "Oslo"}
    assert final.status == "completed"


RECORDED = json.loads(
    (Path(__file__).parent.parent / "fixtures" / "codex_0_171_first_request.json").read_text()
)


def test_the_recorded_codex_first_request_streams_and_names_its_agent(
    tiny_tokenizer: Tokenizer, tmp_path: Path
) -> None:
    """Codex 0.171's first request (tests/fixtures: paths replaced, long texts trimmed): no
    `instructions` (developer messages instead), a namespace of tools, a hosted tool,
    `store: false`, `prompt_cache_key`."""
    served = with_chatml(fake_served(tiny_tokenizer, context=32_768))
    with running(served, tmp_path, num_blocks=128, block_tokens=256) as (api, _, _):
        _codex_first_request(api)


def _codex_first_request(api: TestClient) -> None:
    body = RECORDED["body"] | {"max_output_tokens": 8}
    assert body["store"] is False and body["prompt_cache_key"]
    assert {tool["type"] for tool in body["tools"]} >= {"function", "namespace", "web_search"}
    with api.stream("POST", RECORDED["path"], json=body, headers=RECORDED["headers"]) as response:
        assert response.status_code == 200, response.read()
        raw = "".join(response.iter_text())
    names = [line[7:] for line in raw.splitlines() if line.startswith("event: ")]
    assert names[:2] == ["response.created", "response.in_progress"]
    assert names[-1] in ("response.completed", "response.incomplete")
    assert agent_ids(api) == [body["prompt_cache_key"]]


def test_a_namespaced_tool_call_names_its_namespace(served: ServedModel, tmp_path: Path) -> None:
    client, runner = scripted(served, tmp_path)
    call = '<tool_call>\n{"name": "spawn_agent", "arguments": {"task": "x"}}\n</tool_call>'
    runner.say(served.tokenizer.encode(call))
    spawn = {"type": "function", "name": "spawn_agent", "parameters": {"type": "object"}}
    tools = [{"type": "namespace", "name": "multi_agent_v1", "description": "d", "tools": [spawn]}]
    with client:
        reply = client.post("/v1/responses", json={"model": "m", "input": "Go", "tools": tools})
    (item,) = reply.json()["output"]
    assert item["type"] == "function_call" and item["name"] == "spawn_agent"
    assert item["namespace"] == "multi_agent_v1"
    prompt = served.tokenizer.decode(runner.prompts[-1], skip_special_tokens=False)
    assert '"name": "spawn_agent"' in prompt  # offered to the model


# A later Codex turn (hand-made from its request types): the whole history every turn.
CODEX_REQUEST: dict[str, Any] = {
    "model": "gpt-5-codex",
    "instructions": "You are Codex, based on GPT-5. You are running as a coding agent.",
    "input": [
        {
            "type": "message",
            "role": "user",
            "content": [
                {"type": "input_text", "text": "<environment_context>cwd</environment_context>"}
            ],
        },
        {
            "type": "message",
            "role": "user",
            "content": [{"type": "input_text", "text": "List files"}],
        },
        {"type": "reasoning", "summary": [], "content": None, "encrypted_content": None},
        {
            "type": "function_call",
            "name": "shell",
            "arguments": '{"command":["ls"]}',
            "call_id": "call_1",
        },
        {"type": "function_call_output", "call_id": "call_1", "output": "README.md\nsrc"},
        {
            "type": "custom_tool_call",
            "name": "apply_patch",
            "input": "*** Begin Patch\n*** End Patch",
            "call_id": "call_2",
        },
        {"type": "custom_tool_call_output", "call_id": "call_2", "output": "Done!"},
    ],
    "tools": [
        {
            "type": "function",
            "name": "shell",
            "description": "Runs a shell command",
            "strict": False,
            "parameters": {
                "type": "object",
                "properties": {"command": {"type": "array", "items": {"type": "string"}}},
                "required": ["command"],
                "additionalProperties": False,
            },
        },
        {
            "type": "custom",
            "name": "apply_patch",
            "description": "Patch",
            "format": {"type": "grammar"},
        },
        {"type": "web_search"},
    ],
    "tool_choice": "auto",
    "parallel_tool_calls": False,
    "reasoning": {"effort": "medium", "summary": "auto"},
    "store": False,
    "stream": True,
    "include": ["reasoning.encrypted_content"],
    "prompt_cache_key": "0199a3f0-codex-conversation",
    "text": {"verbosity": "medium"},
}


def test_a_later_codex_turn_with_its_history_streams_and_names_its_agent(
    api: TestClient,
) -> None:
    headers = {"session_id": "0199a3f0", "originator": "codex_cli_rs"}
    with api.stream("POST", "/v1/responses", json=CODEX_REQUEST, headers=headers) as response:
        assert response.status_code == 200
        raw = "".join(response.iter_text())
    names = [line[7:] for line in raw.splitlines() if line.startswith("event: ")]
    assert names[0] == "response.created" and names[-1] in (
        "response.completed",
        "response.incomplete",
    )
    assert agent_ids(api) == ["0199a3f0-codex-conversation"]


def test_another_keys_response_is_not_found(served: ServedModel, tmp_path: Path) -> None:
    keys = ["key-alice", "key-bob"]
    with running(served, tmp_path, num_blocks=600, api_key=keys) as (client, _, _):
        alice = openai.OpenAI(
            base_url=f"{client.base_url}/v1", api_key="key-alice", http_client=client
        )
        bob = openai.OpenAI(base_url=f"{client.base_url}/v1", api_key="key-bob", http_client=client)
        mine = alice.responses.create(model="m", input="Hi", max_output_tokens=4)
        with pytest.raises(openai.NotFoundError):
            bob.responses.retrieve(mine.id)
        with pytest.raises(openai.BadRequestError) as refused:
            bob.responses.create(model="m", input="x", previous_response_id=mine.id)
        assert refused.value.code == "previous_response_not_found"
        assert alice.responses.retrieve(mine.id).id == mine.id

        # The chain's agent (once alice continues it) is alice's key's too: bob's agent list
        # does not hold it.
        alice.responses.create(
            model="m", input="More", previous_response_id=mine.id, max_output_tokens=4
        )

        def listed(key: str) -> list[str]:
            page = client.get("/v1/agents", headers={"Authorization": f"Bearer {key}"})
            return [agent["agent_id"] for agent in page.json()["data"]]

        assert listed("key-bob") == [] and listed("key-alice") == [mine.id]


# -- the store -------------------------------------------------------------------------------


ALICE, BOB = "a" * 32, "b" * 32  # two keys' owner digests


def stored(text: str, owner: str | None = None, previous: str | None = None) -> StoredResponse:
    response: dict[str, Any] = {"id": item_id("resp"), "previous_response_id": previous}
    return StoredResponse(response, [], [{"role": "user", "content": text}], None, owner)


def files_in(root: Path) -> list[str]:
    return sorted(path.stem for path in root.rglob("resp_*.json"))


def test_the_store_keeps_the_newest_within_its_count_and_its_bytes(tmp_path: Path) -> None:
    """Client text is hostile: the oldest responses go once the count or the bytes pass their
    bounds, also as a restarted store counts what the folder holds."""
    store = ResponseStore(tmp_path, max_responses=3)
    records = [stored(f"message {n}") for n in range(5)]
    for record in records:
        store.save(record)
    assert files_in(tmp_path) == sorted(record.id for record in records[2:])
    size = next(tmp_path.rglob(f"{records[-1].id}.json")).stat().st_size
    restarted = ResponseStore(tmp_path, max_responses=100, max_bytes=int(3.5 * size))
    big = stored("x" * size)  # about two of the others
    restarted.save(big)
    assert files_in(tmp_path) == sorted([records[4].id, big.id])
    with pytest.raises(NotFound):
        restarted.load(records[2].id, None)
    assert restarted.load(big.id, None).messages == big.messages


def test_one_keys_responses_push_out_only_its_own(tmp_path: Path) -> None:
    """Each key has its own quota: a key storing many large responses drops its own oldest,
    never another key's, also after a restart; past the total, the biggest holder gives way."""
    store = ResponseStore(tmp_path, max_responses=3)
    bobs = stored("bob's only response", BOB)
    store.save(bobs)
    alices = [stored("x" * 1000, ALICE) for _ in range(10)]
    for record in alices:
        store.save(record)
    assert store.load(bobs.id, BOB).messages == bobs.messages
    assert files_in(tmp_path) == sorted([bobs.id] + [record.id for record in alices[-3:]])
    size = next(tmp_path.rglob(f"{alices[-1].id}.json")).stat().st_size
    restarted = ResponseStore(tmp_path, max_responses=10, max_total_bytes=4 * size)
    restarted.save(stored("x" * 1000, ALICE))
    assert restarted.load(bobs.id, BOB).messages == bobs.messages
    assert len(files_in(tmp_path / ALICE)) == 3


def test_stored_responses_are_readable_by_this_user_only(tmp_path: Path) -> None:
    """They hold clients' conversations: the folders are 0700 (the store's was 0755), the
    files 0600, whatever the umask, and a folder an older version made is tightened."""
    root = tmp_path / "responses"
    root.mkdir(mode=0o755)
    os.chmod(root, 0o755)
    old_umask = os.umask(0o022)
    try:
        ResponseStore(root).save(stored("private", ALICE))
        ResponseStore(root).save(stored("private too"))
    finally:
        os.umask(old_umask)
    folders = [root, *(path for path in root.iterdir() if path.is_dir())]
    assert len(folders) == 3
    assert {stat.S_IMODE(folder.stat().st_mode) for folder in folders} == {0o700}
    assert {stat.S_IMODE(f.stat().st_mode) for f in root.rglob("resp_*.json")} == {0o600}


def test_responses_an_older_version_kept_in_one_folder_are_still_found(tmp_path: Path) -> None:
    """Responses used to lie side by side in the store's folder: a store finds them there and
    files each under its owner, so chains made before an upgrade still continue."""
    flat = [stored("mine", ALICE), stored("nobody's")]
    for record in flat:
        data = json.dumps({"format": 1, **dataclasses.asdict(record)}).encode()
        (tmp_path / f"{record.id}.json").write_bytes(data)
    store = ResponseStore(tmp_path)
    store.save(stored("new", BOB))
    assert store.load(flat[0].id, ALICE).messages == flat[0].messages
    assert store.load(flat[1].id, None).messages == flat[1].messages
    with pytest.raises(NotFound):
        store.load(flat[0].id, BOB)


def test_a_continuation_reads_its_chain_from_memory_not_from_disk(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each turn of a chain followed every earlier response back from disk: the newest records
    are kept in memory (within `cache_bytes`), so a long conversation's next turn reads none;
    a restarted store reads each once."""
    store = ResponseStore(tmp_path)
    chain = [stored("turn 0", ALICE)]
    for n in range(1, 6):
        chain.append(stored(f"turn {n}", ALICE, previous=chain[-1].id))
    for record in chain:
        store.save(record)
    reads: list[Path] = []
    read_bytes = Path.read_bytes

    def counted(path: Path) -> bytes:
        reads.append(path)
        return read_bytes(path)

    monkeypatch.setattr(Path, "read_bytes", counted)
    assert [r.id for r in store.chain(chain[-1].id, ALICE)] == [r.id for r in chain]
    assert reads == []
    with pytest.raises(NotFound):  # another key's, as before
        store.chain(chain[-1].id, BOB)
    restarted = ResponseStore(tmp_path)
    restarted.chain(chain[-1].id, ALICE)
    restarted.chain(chain[-1].id, ALICE)
    assert len(reads) == len(chain)
    small = ResponseStore(tmp_path, cache_bytes=1)  # bounded: holds none of them
    small.chain(chain[-1].id, ALICE)
    small.chain(chain[-1].id, ALICE)
    assert len(reads) == 3 * len(chain)


def test_every_response_validates_as_the_sdks_response_type(api: TestClient) -> None:
    """The SDK parses without validating, so a field its type requires that we leave out only
    shows when a client reads it (`usage.input_tokens_details.cache_write_tokens`): validate
    what the answer, the stored response and a stream's last event carry, field by field."""
    body = {"model": "m", "input": "Hello", "max_output_tokens": 4}
    answer = api.post("/v1/responses", json=body).json()
    stored = api.get(f"/v1/responses/{answer['id']}").json()
    with api.stream("POST", "/v1/responses", json={**body, "stream": True}) as stream:
        lines = [line for line in stream.iter_lines() if line.startswith("data: ")]
    streamed = json.loads(lines[-1].removeprefix("data: "))["response"]
    for response in (answer, stored, streamed):
        usage = openai.types.responses.Response.model_validate(response).usage
        assert usage is not None and usage.input_tokens_details.cache_write_tokens == 0


def test_a_response_samples_and_echoes_the_models_recommendation_where_it_sets_none(
    served: ServedModel, tmp_path: Path
) -> None:
    recommended = DefaultSampling(temperature=0.7, top_p=0.8, top_k=20)
    with running(dataclasses.replace(served, sampling=recommended), tmp_path) as (api, _, _):
        left_out = sdk(api).responses.create(model="m", input="Hi", max_output_tokens=2)
        chosen = sdk(api).responses.create(
            model="m", input="Hi", max_output_tokens=2, temperature=0.0, top_p=0.5
        )
    assert (left_out.temperature, left_out.top_p) == (0.7, 0.8)
    assert (chosen.temperature, chosen.top_p) == (0.0, 0.5)
