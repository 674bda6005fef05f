"""semantic: a local inference server for many LLM agents at once."""

__version__ = "0.1.0"
