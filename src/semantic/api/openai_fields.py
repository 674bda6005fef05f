"""What OpenAI's two generation dialects, Chat Completions (`openai.py`) and the legacy
Completions (`completions.py`), share and no other API does: the fields of both bodies, their
sampling, their finish reasons, the error chunk that ends a failed stream, and what their
routes answer in the OpenAPI document.

What all three chat APIs share is the pipeline's (`pipeline.py`), not this module's.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, WithJsonSchema

from semantic.api.errors import error_payload
from semantic.api.openapi import STREAMED_OR_JSON, error_responses
from semantic.api.pipeline import Sampling
from semantic.api.streaming import data_event
from semantic.core import AGENT_ID_PATTERN, FinishReason
from semantic.errors import InvalidRequest

# What the generation routes answer, for the OpenAPI document.
GENERATION_RESPONSES = {200: STREAMED_OR_JSON, **error_responses("openai", 400, 404, 413, 500, 503)}


class OpenAIBody(BaseModel):
    # Accept generously (unknown fields are ignored), but no silent type coercion.
    model_config = ConfigDict(extra="ignore", strict=True, allow_inf_nan=False)


class StreamOptions(OpenAIBody):
    include_usage: bool = False


_STOP = {"type": "string", "minLength": 1}
_STOPS = {"anyOf": [_STOP, {"type": "array", "items": _STOP}, {"type": "null"}], "default": None}


class GenerationFields(OpenAIBody):
    """What the chat and the legacy completions bodies share: the model, streaming, the output
    budget, sampling, and the extensions."""

    model: str = Field(min_length=1)
    stream: bool = False
    stream_options: StreamOptions | None = None
    max_tokens: int | None = Field(None, ge=1)
    # Left out, each is the served model's recommendation (`ServedModel.sampling`).
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, gt=0, le=1)
    top_k: int | None = Field(None, ge=-1, description="0 or -1 is off.")
    repetition_penalty: float | None = Field(None, gt=0, le=2, description="1 is off.")
    seed: int | None = None
    # An empty stop string would end every answer before its first token (`sampling_of`).
    stop: Annotated[str | list[str] | None, WithJsonSchema(_STOPS)] = None
    n: int = Field(1, ge=1, json_schema_extra={"maximum": 1})  # others: a 400 of our own
    # Extensions that benchmarks and agent clients rely on (vLLM spells them the same way).
    ignore_eos: bool = False
    min_tokens: int = Field(0, ge=0)
    session_id: str | None = Field(None, pattern=AGENT_ID_PATTERN)

    @property
    def include_usage(self) -> bool:
        """Whether a stream ends with a chunk of the usage (`stream_options.include_usage`)."""
        return self.stream_options is not None and self.stream_options.include_usage


def sampling_of(body: GenerationFields) -> Sampling:
    """The sampling fields both bodies share; an empty stop string is a 400."""
    stops = [body.stop] if isinstance(body.stop, str) else list(body.stop or [])
    if any(not stop for stop in stops):
        raise InvalidRequest("stop: a stop sequence may not be empty", param="stop")
    return Sampling(
        body.temperature,
        body.top_p,
        None if body.top_k is None else max(body.top_k, 0),
        body.repetition_penalty,
        body.seed,
        body.min_tokens,
        tuple(stops),
        body.ignore_eos,
    )


def finish_reason_json(reason: FinishReason | None) -> str:
    return "length" if reason is FinishReason.LENGTH else "stop"


def error_chunk(exc: Exception) -> str:
    """The chunk that ends a stream that failed after its 200."""
    return data_event(error_payload(exc))
