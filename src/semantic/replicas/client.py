"""The HTTP side of one vLLM replica: its `/health`, its model's name, and `/v1/completions`
streamed, with our request mapped onto vLLM's fields and vLLM's errors onto ours (the HTTP
itself is `http.py`'s).

The prompt goes as token ids (`prompt: [int, …]`), never as text or chat messages: vLLM then
computes exactly the tokens our chat template rendered, so a conversation's next turn begins
with the same ids as its last one, which is what vLLM's prefix cache matches on.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncGenerator, AsyncIterator
from contextlib import aclosing, asynccontextmanager
from typing import Any, Literal

from semantic.core import GrammarSource, Request
from semantic.errors import EngineFailure, InvalidRequest, Overloaded, SemanticError, Unavailable
from semantic.replicas.http import HttpClient, HttpError, Opener, open_tcp
from semantic.replicas.router import Replica

Health = Literal["up", "slow", "down"]

HEALTH_TIMEOUT_S = 2.0
# A check may time out on a replica that is alive but busy: vLLM's API server answers /health
# on the same event loop that compiles a grammar or tokenizes a long prompt, and on a small CPU
# machine that can take seconds. A replica is taken out after this many timeouts in a row;
# one that refuses the connection or answers an error is out at once.
SLOW_CHECKS_TOLERATED = 3
SCRAPE_TIMEOUT_S = 2.0  # within the 5 s /metrics gives the engine's reading
CONNECT_TIMEOUT_S = 3.0
# A prefill can take minutes on a CPU replica: between two chunks a stream may be silent long.
READ_TIMEOUT_S = 600.0
# The longest SSE line a replica's stream may hold: its first event repeats the prompt's ids
# (~7 bytes a token, so ~1 MB for 128k tokens); a replica sending more without a line's end is
# broken, and its request fails rather than this process growing.
MAX_LINE_BYTES = 16 * 1024 * 1024


class ReplicaDown(Exception):
    """The replica could not be reached, or dropped the connection before answering: the
    request never started there, so another replica may take it."""


def completion_body(
    request: Request, model_id: str, cache_salt: str | None, end_token_ids: frozenset[int]
) -> dict[str, Any]:
    """vLLM's `/v1/completions` body for `request`: streamed, with token ids back (so our own
    detokenizer and stop matcher make the text, as on our engine) and usage at the end. Our
    tokenizer's end tokens are sent as stop tokens, since vLLM's list may be shorter."""
    sampling = request.sampling
    body: dict[str, Any] = {
        "model": model_id,
        "prompt": list(request.prompt_token_ids),
        "max_tokens": sampling.max_tokens,
        "temperature": 0.0 if sampling.greedy else sampling.temperature,
        "top_p": sampling.top_p,
        "top_k": sampling.top_k or -1,  # vLLM's "off" is -1, ours 0
        "repetition_penalty": sampling.repetition_penalty,
        "min_tokens": sampling.min_tokens,
        "ignore_eos": sampling.ignore_eos,
        "stream": True,
        "stream_options": {"include_usage": True},
        "return_token_ids": True,
    }
    if sampling.seed is not None:
        body["seed"] = sampling.seed
    if sampling.stop:
        body["stop"] = list(sampling.stop)
    stop_ids = set(sampling.stop_token_ids) | (set() if sampling.ignore_eos else end_token_ids)
    if stop_ids:
        body["stop_token_ids"] = sorted(stop_ids)
    if cache_salt is not None:
        body["cache_salt"] = cache_salt
    # A lazy grammar (tools offered, no call forced) is left out: it holds a started call to
    # its schema, and our parsers read the calls from the text without it.
    if sampling.grammar is not None and not sampling.grammar.lazy:
        body["structured_outputs"] = structured_outputs(sampling.grammar.source)
    return body


def structured_outputs(source: GrammarSource) -> dict[str, Any]:
    """vLLM's `structured_outputs` for a grammar. A JSON schema goes as a schema, which every
    vLLM grammar backend takes. A forced tool call goes as our Lark grammar of it, in
    llguidance's dialect (`%json`, special tokens by id): vLLM's `guidance` backend is
    llguidance, and xgrammar (what `auto` tries first) reads that dialect too, without its
    `x-guidance` options. A backend that takes neither (outlines, lm-format-enforcer) refuses
    the request: a 400. Whether the JSON may be spaced is the replica's setting
    (`--structured-outputs-config.disable_any_whitespace`): vLLM reads no request's."""
    if source.kind == "json_schema":
        return {"json": json.loads(source.text)}
    return {"grammar": source.text}


class ReplicaClient:
    """Talks to the replicas, each over its own pool of kept connections. `opener` stands in
    for the network in tests."""

    def __init__(self, opener: Opener = open_tcp) -> None:
        self._http = HttpClient(CONNECT_TIMEOUT_S, READ_TIMEOUT_S, opener)

    async def close(self) -> None:
        await self._http.close()

    async def health(self, replica: Replica) -> Health:
        """ "up" when `/health` answers 200 within `HEALTH_TIMEOUT_S`; "slow" when it does not
        answer in that time; "down" when the connection fails or the answer is an error."""
        try:
            status, _ = await self._get(replica, "/health", HEALTH_TIMEOUT_S)
        except TimeoutError:
            return "slow"
        except HttpError:
            return "down"
        return "up" if status == 200 else "down"

    async def read_model(self, replica: Replica) -> str:
        """Set the replica's `model_id`, the name it serves its model under (vLLM refuses any
        other), and its `max_model_len`, the longest sequence it takes (vLLM refuses a longer
        one), from its /v1/models. Returns the name."""
        try:
            status, raw = await self._get(replica, "/v1/models", HEALTH_TIMEOUT_S)
            models = (json.loads(raw).get("data") or []) if status == 200 else []
            model_id, length = str(models[0]["id"]), models[0].get("max_model_len")
        except (HttpError, TimeoutError, ValueError, LookupError, TypeError, AttributeError) as exc:
            raise ReplicaDown(f"{replica.url}/v1/models names no model: {exc!r}") from exc
        replica.model_id = model_id
        replica.max_model_len = length if isinstance(length, int) and length > 0 else None
        return model_id

    async def scraped(self, replica: Replica, names: dict[str, str]) -> dict[str, float]:
        """The replica's own /metrics samples named in `names` (vLLM's name → ours), each
        summed over its labels; empty when it does not answer within `SCRAPE_TIMEOUT_S`."""
        try:
            status, raw = await self._get(replica, "/metrics", SCRAPE_TIMEOUT_S)
        except (HttpError, TimeoutError):
            return {}
        if status != 200:
            return {}
        return _samples(raw.decode("utf-8", "replace"), names)

    async def _get(self, replica: Replica, path: str, timeout_s: float) -> tuple[int, bytes]:
        """A GET's status and body, all of it within `timeout_s` (else `TimeoutError`)."""
        async with asyncio.timeout(timeout_s):
            async with self._http.request("GET", replica.url, path) as response:
                return response.status, await response.read()

    @asynccontextmanager
    async def completions(
        self, replica: Replica, body: dict[str, Any]
    ) -> AsyncIterator[AsyncIterator[dict[str, Any]]]:
        """Start a streamed completion on `replica`: its chunks, parsed. `ReplicaDown` when the
        connection fails (before the answer, or during it); a `SemanticError` for a refusal
        (4xx/5xx) or an error the replica reports mid-stream. Leaving early closes the
        connection, and vLLM aborts the request on that."""
        payload = json.dumps(body, separators=(",", ":")).encode()
        try:
            request = self._http.request("POST", replica.url, "/v1/completions", payload)
            async with request as response:
                if response.status != 200:
                    raise refusal(response.status, _message(await response.read()))
                async with aclosing(_chunks(response.parts())) as chunks:  # even if left early
                    yield chunks
        except (HttpError, TimeoutError) as exc:
            raise ReplicaDown(f"{replica.url}: {exc}") from exc


async def _chunks(body: AsyncGenerator[bytes, None]) -> AsyncGenerator[dict[str, Any], None]:
    """The SSE `data:` payloads of a completion stream's body, up to `[DONE]`. The body is
    read to its end even so: a response left before then closes its connection too, and the
    next request would open (and the replica accept) another."""
    done = False
    async with aclosing(_lines(body)) as lines:
        async for line in lines:
            if done or not line.startswith(b"data:"):
                continue
            data = line[len(b"data:") :].strip()
            if data == b"[DONE]":
                done = True
                continue
            yield _chunk(data)


async def _lines(parts: AsyncGenerator[bytes, None]) -> AsyncGenerator[bytes, None]:
    """The body's lines, split from its bytes (vLLM's stream is UTF-8 JSON, an event a line,
    each event a chunk of its own), none longer than `MAX_LINE_BYTES`."""
    rest = b""
    async with aclosing(parts):
        async for part in parts:
            lines = (rest + part if rest else part).split(b"\n")
            rest = lines.pop()  # an unfinished line, completed by the next part
            if len(rest) > MAX_LINE_BYTES:
                raise HttpError(f"a line of the stream over {MAX_LINE_BYTES} bytes")
            for line in lines:
                yield line
    if rest:
        yield rest


def _chunk(data: bytes) -> dict[str, Any]:
    """One event's payload, or the refusal it reports."""
    chunk: dict[str, Any] = json.loads(data)
    if "error" in chunk or chunk.get("object") == "error":
        # vLLM sends its 200 before it validates: a refusal (a grammar its backend rejects:
        # code 400) comes as the stream's first event, with the status it would have had.
        error = chunk.get("error", chunk)
        code = error.get("code") if isinstance(error, dict) else None
        raise refusal(code if isinstance(code, int) else 500, _message(data))
    return chunk


def _samples(text: str, names: dict[str, str]) -> dict[str, float]:
    """From Prometheus' text format, the samples of `names`, by our name, summed over labels
    (a line is `name{labels} value [timestamp]`; a line that does not parse is skipped)."""
    found: dict[str, float] = {}
    for line in text.splitlines():
        name = line.partition("{")[0].partition(" ")[0]
        ours = names.get(name)
        if ours is None:
            continue
        fields = line.rpartition("}")[2].split() if "{" in line else line.split()[1:]
        try:
            found[ours] = found.get(ours, 0.0) + float(fields[0])
        except (IndexError, ValueError):
            continue
    return found


def refusal(status: int, message: str) -> SemanticError:
    """Our error for a replica's refusal or failure (its HTTP status, or the code of the error
    event its stream began with), so a client gets its protocol's shape."""
    text = f"the vLLM replica {'refused' if status < 500 else 'failed'} the request: {message}"
    if status in (400, 422):
        return InvalidRequest(text)
    if status in (429, 503):
        return Overloaded(text)
    if status == 404:  # the model name it serves changed under us (a restart with another)
        return Unavailable(text)
    return EngineFailure(text)


def _message(raw: bytes | str) -> str:
    """The message of vLLM's error body (`{"error": {"message"}}`, or older `{"message"}`)."""
    try:
        body = json.loads(raw)
    except ValueError:
        return str(raw[:200])
    error = body.get("error", body) if isinstance(body, dict) else body
    message = error.get("message") if isinstance(error, dict) else error
    return str(message)[:500]
