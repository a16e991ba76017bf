"""EdgeSpec: speculative generation for local GGUF models."""

__version__ = "0.1.0"
