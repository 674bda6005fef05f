"""The OpenAI API end to end: a real server on SmolLM2, the official SDK, and raw HTTP."""

from __future__ import annotations

import json
import threading
import time
from typing import Any

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.e2e.conftest import Server

pytestmark = pytest.mark.e2e

PARIS = {
    "model": "smollm2-135m",
    "messages": [{"role": "user", "content": "What is the capital of France?"}],
    "temperature": 0,
}


def client(server: Server) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0)


def ask_paris(sdk: openai.OpenAI, **kwargs: Any) -> Any:
    """The README's question through the SDK, with extra arguments."""
    return sdk.chat.completions.create(**{**PARIS, **kwargs})


def test_the_readme_curl_request_names_paris(server: Server) -> None:
    response = httpx.post(
        f"{server.url}/v1/chat/completions", content=json.dumps(PARIS), timeout=60
    )
    assert response.status_code == 200
    body = response.json()
    assert "Paris" in body["choices"][0]["message"]["content"]
    assert body["choices"][0]["finish_reason"] == "stop"
    assert body["usage"]["total_tokens"] == (
        body["usage"]["prompt_tokens"] + body["usage"]["completion_tokens"]
    )
    assert response.headers["x-request-id"].startswith("req_")


def test_sdk_stream_with_usage_matches_the_non_streamed_answer(server: Server) -> None:
    sdk = client(server)
    whole = ask_paris(sdk, max_tokens=24)
    stream = ask_paris(sdk, max_tokens=24, stream=True, stream_options={"include_usage": True})
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert (
        finishes[-1] == whole.choices[0].finish_reason and finishes.count(None) == len(finishes) - 1
    )
    usage_chunks = [c for c in chunks if c.usage is not None]
    assert len(usage_chunks) == 1 and usage_chunks[0] is chunks[-1] and not chunks[-1].choices
    assert usage_chunks[0].usage.completion_tokens == whole.usage.completion_tokens


def test_max_tokens_ends_with_finish_reason_length(server: Server) -> None:
    answer = client(server).chat.completions.create(
        model="anything",
        messages=[{"role": "user", "content": "Count to one hundred."}],
        max_tokens=5,
        temperature=0,
    )
    assert answer.choices[0].finish_reason == "length"
    assert answer.usage is not None and answer.usage.completion_tokens == 5


def test_stop_sequence_cuts_the_text_before_it(server: Server) -> None:
    sdk = client(server)
    free = ask_paris(sdk, max_tokens=24).choices[0].message.content or ""
    assert "Paris" in free
    cut = ask_paris(sdk, max_tokens=24, stop=["Paris"])
    assert cut.choices[0].message.content == free[: free.index("Paris")]
    assert cut.choices[0].finish_reason == "stop"


def test_seeded_sampling_is_reproducible(server: Server) -> None:
    sdk = client(server)
    first = ask_paris(sdk, temperature=1.0, seed=1234, max_tokens=16)
    second = ask_paris(sdk, temperature=1.0, seed=1234, max_tokens=16)
    assert first.choices[0].message.content == second.choices[0].message.content


def test_concurrent_requests_each_get_their_own_answer(fp32_server: Server) -> None:
    server = fp32_server
    questions = [
        "What is the capital of France?",
        "What is 2 + 2?",
        "Name a color.",
        "What is the capital of Italy?",
    ]
    solo = {q: _ask(server, q) for q in questions}
    results: dict[str, str] = {}
    threads = [
        threading.Thread(target=lambda q=q: results.__setitem__(q, _ask(server, q)))
        for q in questions
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert results == solo


def _ask(server: Server, question: str) -> str:
    answer = client(server).chat.completions.create(
        model="smollm2-135m",
        messages=[{"role": "user", "content": question}],
        temperature=0,
        max_tokens=20,
    )
    return answer.choices[0].message.content or ""


def test_a_hostile_temperature_joining_running_streams_fails_none_of_them(
    fp32_server: Server,
) -> None:
    """Two answers are streaming when a request with temperature 1e-300 joins their steps; all
    three end normally (before, its NaN probabilities failed every request in the step), and
    it answers as greedy decoding does (float32: batched and alone agree exactly)."""
    sdk = client(fp32_server)
    streams = [
        ask_paris(sdk, max_tokens=200, stream=True, extra_body={"ignore_eos": True})
        for _ in range(2)
    ]
    firsts = [next(iter(stream)) for stream in streams]  # both are decoding now
    hostile = ask_paris(sdk, temperature=1e-300, max_tokens=8)
    assert hostile.choices[0].message.content
    assert (
        hostile.choices[0].message.content
        == ask_paris(sdk, max_tokens=8).choices[0].message.content
    )
    for first, stream in zip(firsts, streams, strict=True):
        chunks = [first, *stream]
        assert chunks[-1].choices[0].finish_reason == "length"


def test_models_lists_the_loaded_model(server: Server) -> None:
    models = client(server).models.list()
    assert [m.id for m in models.data] == ["smollm2-135m"]


def test_client_disconnect_mid_stream_aborts_the_request(server: Server) -> None:
    body = {**PARIS, "stream": True, "max_tokens": 2000, "ignore_eos": True}
    # The server is shared: other tests' cache breakpoints may hold pages until they expire.
    held_before = httpx.get(f"{server.url}/health/ready").json()["blocks_held"]
    with httpx.stream("POST", f"{server.url}/v1/chat/completions", json=body, timeout=60) as r:
        for line in r.iter_lines():
            if '"content":"' in line and '"content":""' not in line:
                break  # the first token arrived: hang up
    deadline = time.monotonic() + 60  # a hang guard: a loaded machine aborts later
    while time.monotonic() < deadline:
        ready = httpx.get(f"{server.url}/health/ready").json()
        if ready["running"] == 0 and ready["waiting"] == 0:
            break
        time.sleep(0.1)
    assert ready["running"] == 0 and ready["waiting"] == 0
    assert ready["blocks_held"] <= held_before
    assert "Paris" in _ask(server, "What is the capital of France?")


LONG = "word " * 9000

BAD_REQUESTS = [
    ("not json", b"{this is not json"),
    ("empty messages", {"model": "m", "messages": []}),
    ("missing messages", {"model": "m"}),
    ("missing model", {"messages": [{"role": "user", "content": "hi"}]}),
    ("messages not a list", {"model": "m", "messages": "hi"}),
    ("content wrong type", {"model": "m", "messages": [{"role": "user", "content": 5}]}),
    ("unknown role", {"model": "m", "messages": [{"role": "wizard", "content": "hi"}]}),
    ("negative max_tokens", {**PARIS, "max_tokens": -1}),
    ("zero max_tokens", {**PARIS, "max_tokens": 0}),
    ("huge max_tokens", {**PARIS, "max_tokens": 10**9}),
    ("max_tokens as string", {**PARIS, "max_tokens": "10"}),
    ("temperature too high", {**PARIS, "temperature": 3}),
    ("top_p zero", {**PARIS, "top_p": 0}),
    ("stream not bool", {**PARIS, "stream": "yes"}),
    ("n above one", {**PARIS, "n": 2}),
    (
        "image content",
        {
            "model": "m",
            "messages": [
                {
                    "role": "user",
                    "content": [
                        {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}
                    ],
                }
            ],
        },
    ),
    ("bad session id", {**PARIS, "session_id": "../../etc/passwd"}),
    (
        "prompt longer than the context",
        {"model": "m", "messages": [{"role": "user", "content": LONG}]},
    ),
]


@pytest.mark.parametrize(("case", "body"), BAD_REQUESTS, ids=[c for c, _ in BAD_REQUESTS])
def test_bad_input_gets_a_400_in_the_openai_error_shape(
    server: Server, case: str, body: object
) -> None:
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    response = httpx.post(
        f"{server.url}/v1/chat/completions",
        content=content,
        timeout=60,
        headers={"content-type": "application/json"},
    )
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["type"] == "invalid_request_error" and error["message"]


def test_context_overflow_says_so_in_openai_words(server: Server) -> None:
    response = httpx.post(
        f"{server.url}/v1/chat/completions",
        timeout=60,
        json={"model": "m", "messages": [{"role": "user", "content": LONG}]},
    )
    assert response.json()["error"]["code"] == "context_length_exceeded"
    assert "maximum context length" in response.json()["error"]["message"]


def test_unknown_route_is_a_404_in_the_error_shape(server: Server) -> None:
    response = httpx.get(f"{server.url}/v1/nothing-here")
    assert response.status_code == 404 and "error" in response.json()


def test_min_tokens_and_ignore_eos_make_the_answer_as_long_as_asked(server: Server) -> None:
    sdk = client(server)
    natural = ask_paris(sdk, max_tokens=64).usage.completion_tokens
    longer = ask_paris(sdk, max_tokens=64, extra_body={"min_tokens": natural + 10})
    assert longer.usage.completion_tokens >= natural + 10
    endless = ask_paris(sdk, max_tokens=48, extra_body={"ignore_eos": True})
    assert endless.usage.completion_tokens == 48
    assert endless.choices[0].finish_reason == "length"


# -- legacy completions ----------------------------------------------------------------------

FRANCE = "The capital of France is"


def complete(sdk: openai.OpenAI, **kwargs: Any) -> Any:
    """A greedy legacy completion of FRANCE, with extra arguments."""
    arguments = {"model": "smollm2-135m", "prompt": FRANCE, "max_tokens": 8, "temperature": 0}
    return sdk.completions.create(**{**arguments, **kwargs})


def test_sdk_legacy_completion_continues_the_raw_prompt(server: Server) -> None:
    answer = complete(client(server))
    assert answer.object == "text_completion" and answer.id.startswith("cmpl-")
    assert "Paris" in answer.choices[0].text
    assert answer.choices[0].finish_reason in ("stop", "length")
    # No chat template around it: the prompt is its own handful of tokens.
    assert answer.usage is not None and answer.usage.prompt_tokens < 10
    assert answer.usage.total_tokens == answer.usage.prompt_tokens + answer.usage.completion_tokens


def test_sdk_legacy_completion_stream_and_echo_agree_with_the_whole_answer(server: Server) -> None:
    sdk = client(server)
    whole = complete(sdk)
    stream = complete(sdk, stream=True, stream_options={"include_usage": True})
    chunks = list(stream)
    assert "".join(c.choices[0].text for c in chunks if c.choices) == whole.choices[0].text
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert finishes[-1] == whole.choices[0].finish_reason and set(finishes[:-1]) <= {None}
    assert not chunks[-1].choices and chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == whole.usage.completion_tokens
    echoed = complete(sdk, echo=True)
    assert echoed.choices[0].text == FRANCE + whole.choices[0].text


def test_sdk_legacy_completion_refuses_what_it_cannot_do_by_name(server: Server) -> None:
    sdk = client(server)
    for refused in ({"n": 2}, {"best_of": 3}, {"logprobs": 6}, {"suffix": "."}):
        with pytest.raises(openai.BadRequestError) as raised:
            complete(sdk, **refused)
        assert raised.value.param == next(iter(refused))


def test_one_chat_shows_in_metrics_and_in_the_json_log(server: Server) -> None:
    before = scrape(server)
    body = {**PARIS, "max_tokens": 8, "session_id": "metrics-e2e"}
    response = httpx.post(f"{server.url}/v1/chat/completions", json=body, timeout=60)
    assert response.status_code == 200
    after = scrape(server)
    chats = ("semantic_requests_total", 'route="/v1/chat/completions",status="200"')
    assert after[chats] == before.get(chats, 0) + 1
    first_tokens = ("semantic_time_to_first_token_seconds_count", "")
    assert after[first_tokens] == before[first_tokens] + 1
    generated = ("semantic_generated_tokens_total", "")
    assert after[generated] == before[generated] + response.json()["usage"]["completion_tokens"]
    assert after[("process_resident_memory_bytes", "")] > 0
    # stderr is a file here, so log lines are JSON (a native library may print other lines)
    logged = server.log_path.read_text().splitlines()
    lines = [json.loads(line) for line in logged if line.startswith("{")]
    request_id = response.headers["x-request-id"]
    mine = {line["logger"]: line for line in lines if line.get("request_id") == request_id}
    assert mine["semantic.engine.engine"]["event"] == "request finished"
    assert mine["semantic.engine.engine"]["agent_id"] == "metrics-e2e"
    assert '"POST /v1/chat/completions HTTP/1.1" 200' in mine["uvicorn.access"]["event"]


def scrape(server: Server) -> dict[tuple[str, str], float]:
    """/metrics by sample name and labels (`a="x",b="y"`, sorted)."""
    text = httpx.get(f"{server.url}/metrics", timeout=30).text
    return {
        (s.name, ",".join(f'{k}="{v}"' for k, v in sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }
