"""superinfer: an SLO-aware policy layer for LLM inference engines."""

__version__ = "0.1.0"
