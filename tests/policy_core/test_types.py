"""Value types: validation and the token accounting of ``RequestView``."""

from __future__ import annotations

import dataclasses

import pytest

from superinfer.policy_core.types import SLO, KVLocation, PrefixNodeView
from tests.factories import make_view


def test_slo_rejects_bad_targets() -> None:
    with pytest.raises(ValueError, match="ttft_ms must be > 0"):
        SLO("chat", ttft_ms=0)
    with pytest.raises(ValueError, match="non-empty"):
        SLO("")
    with pytest.raises(ValueError, match="weight"):
        SLO("x", weight=-1)


def test_views_are_frozen() -> None:
    view = make_view("a")
    with pytest.raises(dataclasses.FrozenInstanceError):
        view.generated_tokens = 3  # type: ignore[misc]


@pytest.mark.parametrize(
    ("computed", "generated", "pending", "prefilling"),
    [
        (0, 0, 100, True),  # fresh
        (60, 0, 40, True),  # mid-prefill (chunked)
        (100, 1, 1, False),  # decoding: first token sampled, its KV not yet computed
        (105, 6, 1, False),
        (0, 6, 106, True),  # recompute after preemption: prompt and generated tokens again
    ],
)
def test_pending_tokens(computed: int, generated: int, pending: int, prefilling: bool) -> None:
    view = make_view("a", prompt=100, computed=computed, generated=generated)
    assert view.num_tokens == 100 + generated
    assert view.pending_tokens == pending
    assert view.is_prefilling is prefilling


def test_a_node_is_its_chunk_keys_with_a_content_key_else_one_chunk_named_by_its_id() -> None:
    base = PrefixNodeView("7", None, 32, 2, KVLocation.HBM, 0, 0.0, False)
    assert (base.key, base.chunks) == ("7", ("7",))
    keyed = dataclasses.replace(base, content_key="h2", chunk_keys=("h1", "h2"))
    assert (keyed.key, keyed.chunks) == ("h2", ("h1", "h2"))
    assert dataclasses.replace(base, content_key="h1").chunks == ()  # no whole chunk ends in it
