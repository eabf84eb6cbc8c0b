"""Fixtures for the server: the real SmolLM2 model, shared with the hf adapter's tests."""

from __future__ import annotations

from tests.adapters.hf.conftest import smollm2  # noqa: F401  (the session-scoped fixture)
