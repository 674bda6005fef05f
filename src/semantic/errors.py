"""One exception hierarchy for the whole server; `api/errors.py` maps it onto each protocol."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from semantic.core import StepToken


class SemanticError(Exception):
    """Base of every error semantic raises on purpose."""


class InvalidSettings(SemanticError):
    """A setting's value is not valid; the message names it and where it came from."""


class InvalidRequest(SemanticError):
    """The client sent something we cannot serve (maps to 400)."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


class PreviousResponseNotFound(InvalidRequest):
    """A Responses request continues a stored response that is not there (400, as OpenAI
    answers it: the code `previous_response_not_found`, which clients recover from)."""

    def __init__(self, response_id: str) -> None:
        super().__init__(
            f"Previous response with id {response_id[:80]!r} not found.",
            param="previous_response_id",
        )


class ContextOverflow(InvalidRequest):
    """The prompt plus requested output does not fit the model's context (400). `param` is the
    field that holds the prompt; `blame`, when given, the field the client should change
    instead (a `max_tokens` too large for the room the prompt leaves)."""

    def __init__(
        self,
        prompt_tokens: int,
        max_tokens: int,
        context_length: int,
        param: str = "messages",
        *,
        blame: str | None = None,
    ) -> None:
        super().__init__(
            f"This model's maximum context length is {context_length} tokens. However, you "
            f"requested {prompt_tokens + max_tokens} tokens ({prompt_tokens} in the {param}, "
            f"{max_tokens} in the completion). Please reduce the length of the {param} or "
            "completion.",
            param=blame or param,
        )
        self.prompt_tokens = prompt_tokens
        self.max_tokens = max_tokens
        self.context_length = context_length


class PromptTooLong(ContextOverflow):
    """A prompt longer than this server takes (`max_prompt_tokens`), whatever room the context
    has (400). A context overflow, so Anthropic clients get the wording Claude Code compacts on."""

    def __init__(self, prompt_tokens: int, limit: int, param: str = "messages") -> None:
        # A context of limit + 1 leaves no room at all: the longest prompt it takes is `limit`.
        super().__init__(prompt_tokens, 0, limit + 1, param)
        self.args = (
            f"{param}: the prompt is {prompt_tokens} tokens; this server takes at most {limit} "
            "(max_prompt_tokens)",
        )


class PromptPastContext(ContextOverflow):
    """A prompt refused before it is rendered: its request holds more text, or more JSON
    objects, than a prompt of at most `limit` tokens could hold however it tokenized (400).
    `prompt_tokens` is the fewest tokens it could be; a context overflow, so Anthropic clients
    get the wording Claude Code compacts on."""

    def __init__(self, fewest_tokens: int, limit: int, param: str, why: str) -> None:
        super().__init__(fewest_tokens, 0, limit + 1, param)
        self.args = (f"{param}: {why}",)


class NotFound(SemanticError):
    """An unknown model, agent or route (404)."""


class ModelNotFound(NotFound):
    """A request names a model this server does not serve (404, OpenAI's `model_not_found`)."""


class Conflict(SemanticError):
    """The request clashes with the state it would change: an agent id that is taken, an agent
    that is already generating (409)."""


class ConversationTooLarge(InvalidRequest):
    """A conversation the agent API would keep is past `max_conversation_mb` (400)."""


class RequestTooLarge(InvalidRequest):
    """A request that unpacks to more than this server takes: its sealed reasoning, opened, is
    past the body limit (413, as a body past it is)."""


class TooManyAgents(SemanticError):
    """An API key has as many agents as it may keep, and none of them may make room (403)."""


class ConversationQuotaExceeded(SemanticError):
    """An API key's agents would keep more conversation text than `max_conversations_mb_per_key`
    (413: what the key would store is too large, however small the request)."""


class PinLimit(SemanticError):
    """Pinning an agent would hold more of the KV pool than its API key's pins may (403)."""


class RetentionLimit(SemanticError):
    """A request's cache breakpoints would make its API key keep more tokens than
    `max_retained_tokens_per_key` (403)."""


class PersistFailed(SemanticError):
    """A persist the client waits for could not make everything durable (disk full, I/O error)."""


class Overloaded(SemanticError):
    """No capacity right now: the queue wait timed out or the server is draining (503/529)."""


class Unavailable(SemanticError):
    """The server takes no requests now: its model is still loading, or it is shutting down
    (503 in every protocol; a request that outlasts the shutdown timeout ends with this too)."""


class NotSupported(SemanticError):
    """The engine serving this server cannot do what the request asks (501): the direct agent
    API, pin, evict or a model swap on the engine over vLLM replicas (`engine/port.py`)."""


class RateLimited(SemanticError):
    """An API key or an agent is over its requests per minute (429, with `retry-after`)."""

    def __init__(self, message: str, retry_after_s: float) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class PoolExhausted(SemanticError):
    """A request can never fit the block pool, however long it waits."""


class CacheCorrupt(SemanticError):
    """A cache file failed its checks; it is quarantined and counted as a miss."""


class CacheFolderBusy(SemanticError):
    """Another process holds the cache folder's lock: a server, or `semantic agents delete`."""

    def __init__(self, folder: Path, holder_pid: int | None) -> None:
        holder = "another semantic process" + ("" if holder_pid is None else f" (pid {holder_pid})")
        super().__init__(
            f"the cache folder {folder} is in use by {holder}: one cache folder serves one "
            "server, so give this one its own --cache-dir, or stop the other"
        )
        self.folder = folder
        self.holder_pid = holder_pid


class FolderNotPrivate(SemanticError):
    """A folder the server loads files from is another user's, or others may write it: what
    lies there may have been planted. The message names the folder and the command that fixes
    it."""

    def __init__(self, folder: Path, message: str) -> None:
        super().__init__(message)
        self.folder = folder


class ModelLoadFailed(SemanticError):
    """Weights, tokenizer or config could not be loaded."""


class EngineFailure(SemanticError):
    """The engine loop raised while running a step; the requests in that step fail with this."""


class RowsFailed(SemanticError):
    """The runner computed a step but could not sample some of its items (non-finite
    probabilities, a value the draw refuses). `errors` says why for each, by batch index;
    `tokens` carries the other items' tokens (a verified draft's as a list, as `run` gives
    them), so their requests go on and only these fail."""

    def __init__(self, tokens: list[StepToken], errors: dict[int, Exception]) -> None:
        super().__init__(f"{len(errors)} of the step's {len(tokens)} items could not be sampled")
        self.tokens = tokens
        self.errors = errors
