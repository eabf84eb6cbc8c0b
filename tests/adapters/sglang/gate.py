"""Skip a test module without sglang, unless ``make test`` requires it."""

from __future__ import annotations

import os

import pytest


def require_sglang() -> None:
    """Import sglang or skip the calling module; with ``SUPERINFER_REQUIRE_SGLANG=1`` (set by
    ``make test``, which installs it) a missing sglang is an error, never a silent skip."""
    if os.environ.get("SUPERINFER_REQUIRE_SGLANG") == "1":
        import sglang.srt  # noqa: F401
    else:
        pytest.importorskip("sglang.srt", reason="sglang not installed (make install-sglang)")
