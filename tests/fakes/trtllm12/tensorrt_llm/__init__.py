"""Test double of TensorRT-LLM 1.2.x (see tests/fakes/README.md). Never installed; tests put its
parent folder on ``sys.path`` for the duration of a test."""

__version__ = "1.2.1"

from .llmapi import LLM, SamplingParams  # noqa: E402

__all__ = ["LLM", "SamplingParams", "__version__"]
