"""Models: which one a name means (`registry.py`), its checkpoint read into a config, a tokenizer,
a chat template and numpy weights (`checkpoint.py`, over `gguf.py` and `hf.py`), and what makes
each family that family (`families/`)."""
