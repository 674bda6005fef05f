"""Twenty JSON schemas of the shapes clients ask for (nested objects, arrays, enums, bounded
numbers, required and optional fields), each with a question a small model can answer. Strings
and arrays carry bounds, as agents' schemas do, so that every answer fits its token budget."""

from __future__ import annotations

from typing import Any

NAME = {"type": "string", "minLength": 1, "maxLength": 24}
SHORT = {"type": "string", "maxLength": 40}


def obj(properties: dict[str, Any], required: list[str] | None = None) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": properties,
        "required": list(properties) if required is None else required,
        "additionalProperties": False,
    }


SCHEMAS: list[tuple[str, str, dict[str, Any]]] = [
    (
        "person",
        "Describe a person named Ann who is 30.",
        obj({"name": NAME, "age": {"type": "integer", "minimum": 0, "maximum": 120}}),
    ),
    ("city", "Name the capital of France and its country.", obj({"city": NAME, "country": NAME})),
    ("yes_no", "Is water wet?", obj({"answer": {"enum": ["yes", "no"]}})),
    (
        "sentiment",
        "Classify: 'I love this movie!'",
        obj(
            {
                "label": {"enum": ["positive", "negative", "neutral"]},
                "confidence": {"type": "integer", "minimum": 0, "maximum": 100},
            }
        ),
    ),
    (
        "colors",
        "List three colors.",
        obj({"colors": {"type": "array", "items": NAME, "minItems": 1, "maxItems": 3}}),
    ),
    (
        "point",
        "Give a point on a grid.",
        obj(
            {
                "x": {"type": "integer", "minimum": -10, "maximum": 10},
                "y": {"type": "integer", "minimum": -10, "maximum": 10},
            }
        ),
    ),
    (
        "book",
        "Describe a book.",
        obj(
            {
                "title": SHORT,
                "author": NAME,
                "year": {"type": "integer", "minimum": 1450, "maximum": 2030},
            },
            ["title", "author"],
        ),
    ),
    (
        "address",
        "Write an address.",
        obj({"street": SHORT, "city": NAME, "zip": {"type": "string", "pattern": "^[0-9]{5}$"}}),
    ),
    (
        "nested",
        "Describe a user and their settings.",
        obj(
            {
                "user": obj(
                    {"id": {"type": "integer", "minimum": 1, "maximum": 9999}, "name": NAME}
                ),
                "settings": obj(
                    {"theme": {"enum": ["light", "dark"]}, "notifications": {"type": "boolean"}}
                ),
            }
        ),
    ),
    (
        "todo",
        "Make a short to-do list.",
        obj(
            {
                "items": {
                    "type": "array",
                    "maxItems": 3,
                    "items": obj({"task": SHORT, "done": {"type": "boolean"}}),
                }
            }
        ),
    ),
    (
        "rating",
        "Rate the film Jaws.",
        obj({"film": NAME, "stars": {"type": "integer", "minimum": 1, "maximum": 5}}),
    ),
    (
        "optional",
        "Describe a pet.",
        obj(
            {
                "name": NAME,
                "species": {"enum": ["cat", "dog", "bird"]},
                "age": {"type": "integer", "minimum": 0, "maximum": 30},
            },
            ["name", "species"],
        ),
    ),
    (
        "weather",
        "Report the weather.",
        obj(
            {
                "temperature": {"type": "integer", "minimum": -50, "maximum": 50},
                "unit": {"enum": ["C", "F"]},
                "sunny": {"type": "boolean"},
            }
        ),
    ),
    (
        "tags",
        "Tag this text: 'Python tips for data science'.",
        obj(
            {
                "tags": {
                    "type": "array",
                    "items": {"enum": ["python", "data", "web", "ml", "tips"]},
                    "minItems": 1,
                    "maxItems": 4,
                }
            }
        ),
    ),
    (
        "math",
        "What is 2 + 3?",
        obj(
            {"expression": SHORT, "result": {"type": "integer", "minimum": -1000, "maximum": 1000}}
        ),
    ),
    (
        "matrix",
        "Give a 2x2 grid of digits.",
        obj(
            {
                "rows": {
                    "type": "array",
                    "minItems": 2,
                    "maxItems": 2,
                    "items": {
                        "type": "array",
                        "minItems": 2,
                        "maxItems": 2,
                        "items": {"type": "integer", "minimum": 0, "maximum": 9},
                    },
                }
            }
        ),
    ),
    (
        "event",
        "Plan a meeting.",
        obj(
            {
                "title": SHORT,
                "day": {"enum": ["mon", "tue", "wed", "thu", "fri"]},
                "attendees": {"type": "array", "items": NAME, "maxItems": 3},
            },
            ["title", "day"],
        ),
    ),
    (
        "product",
        "Describe a product for sale.",
        obj(
            {
                "name": SHORT,
                "price": {"type": "number", "minimum": 0, "maximum": 1000},
                "in_stock": {"type": "boolean"},
            }
        ),
    ),
    (
        "translation",
        "Translate 'hello' into French.",
        obj({"source": NAME, "target": NAME, "language": {"enum": ["fr", "es", "de"]}}),
    ),
    (
        "tree",
        "Describe a small family.",
        obj(
            {
                "parent": NAME,
                "children": {
                    "type": "array",
                    "maxItems": 2,
                    "items": obj(
                        {"name": NAME, "age": {"type": "integer", "minimum": 0, "maximum": 20}}
                    ),
                },
            }
        ),
    ),
]
