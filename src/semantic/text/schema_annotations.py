"""A JSON Schema without its annotations (`description`, `title`, `examples`, `$comment`):
words for people and models that do not change which values are valid, so a grammar compiled
from the schema is the same without them, and a client's megabytes of description need not be
compiled, cached or counted against the schema's size limit.

Only keywords in a schema's own place are removed: a property named `description` (a key of
`properties`), an `enum` value or a `default` holding one are the schema's data, kept as sent.
"""

from __future__ import annotations

from typing import Any

ANNOTATIONS = frozenset({"description", "title", "examples", "$comment"})
# Keywords whose value is a schema, a list of schemas, or a map from names to schemas.
_SCHEMA = frozenset(
    {
        "items",
        "additionalItems",
        "additionalProperties",
        "unevaluatedItems",
        "unevaluatedProperties",
        "contains",
        "propertyNames",
        "not",
        "if",
        "then",
        "else",
    }
)
_SCHEMA_LISTS = frozenset({"allOf", "anyOf", "oneOf", "prefixItems", "items"})
_SCHEMA_MAPS = frozenset(
    {"properties", "patternProperties", "$defs", "definitions", "dependentSchemas"}
)


def without_annotations(schema: Any) -> Any:
    """`schema` less its annotations, at every depth a schema can sit; any other value (a
    boolean schema, a malformed one) as it is, for the grammar engine to judge."""
    if not isinstance(schema, dict):
        return schema
    return {
        keyword: _value_without_annotations(keyword, value)
        for keyword, value in schema.items()
        if keyword not in ANNOTATIONS
    }


def _value_without_annotations(keyword: str, value: Any) -> Any:
    if keyword in _SCHEMA_LISTS and isinstance(value, list):
        return [without_annotations(item) for item in value]
    if keyword in _SCHEMA_MAPS and isinstance(value, dict):
        return {name: without_annotations(item) for name, item in value.items()}
    if keyword in _SCHEMA:
        return without_annotations(value)
    return value
