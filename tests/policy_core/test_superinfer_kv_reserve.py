"""``superinfer``'s KV reserve for TTFT-class arrivals where it may not preempt
(``ttft_kv_reserve_requests``): exact block arithmetic on hand-made states."""

from __future__ import annotations

import pytest

from superinfer.policy_core.policies.superinfer import SuperInferPolicy
from superinfer.policy_core.types import StepState
from tests.factories import BATCH, make_state, make_view
from tests.policy_core.test_superinfer import arrive, decide, decoding, policy

# block size 16: a chat of 100 prompt tokens and a 60-token cap holds 160 tokens = 10 blocks,
# so the default reserve of 4 such requests is 40 blocks; the batch prompt of 160 tokens takes
# 10 blocks when admitted (an engine without an admission reserve: make_state's default)
CHAT_PROMPT, CHAT_CAP, BATCH_PROMPT = 100, 60, 160


def _policy(**options: object) -> SuperInferPolicy:
    p = policy(**{"max_preemptions_per_step": 0, "kv_watermark": 0.0, **options})
    arrive(p, make_view("c0", prompt=CHAT_PROMPT, max_output=CHAT_CAP))
    arrive(p, make_view("b", prompt=BATCH_PROMPT, max_output=10, slo=BATCH))
    return p


def _state(free: int, *, running: bool = True) -> StepState:
    chat = [decoding("c0", CHAT_PROMPT, 5)] if running else []
    waiting = [make_view("b", prompt=BATCH_PROMPT, max_output=10, slo=BATCH)]
    return make_state(running=chat, waiting=waiting, free_blocks=free)


def test_the_reserve_is_four_ttft_class_footprints_in_whole_blocks() -> None:
    p = _policy()
    assert p._ttft_kv_reserve(16) == 4 * 10
    assert p._ttft_kv_reserve(64) == 4 * 3  # 160 tokens in 64-token blocks: 3
    assert _policy(ttft_kv_reserve_requests=3)._ttft_kv_reserve(16) == 30
    assert policy()._ttft_kv_reserve(16) == 0  # no TTFT-class request seen yet


@pytest.mark.parametrize(
    ("free", "options", "running", "admitted"),
    [
        (50, {}, True, True),  # 50 - 10 = 40 left: the reserve holds
        (49, {}, True, False),  # 39 left: the batch waits (not even a first chunk)
        (49, {"max_preemptions_per_step": 8}, True, True),  # a chat could preempt for room
        (49, {"ttft_kv_reserve_requests": 0}, True, True),  # reserve off
        (49, {}, False, True),  # nothing runs: an idle replica admits (no starvation)
        (10, {}, False, True),  # ... even into its last blocks
    ],
)
def test_a_batch_admission_leaves_the_reserve_free(
    free: int, options: dict[str, object], running: bool, admitted: bool
) -> None:
    p = _policy(**options)
    decision = decide(p, _state(free, running=running))
    assert ("b" in decision.num_tokens) is admitted
    if admitted:
        assert decision.num_tokens["b"] == BATCH_PROMPT


def test_a_ttft_class_admission_may_use_the_reserve() -> None:
    p = _policy()
    arrive(p, make_view("c1", prompt=CHAT_PROMPT, max_output=CHAT_CAP))
    waiting = [make_view("c1", prompt=CHAT_PROMPT, max_output=CHAT_CAP)]
    state = make_state(running=[decoding("c0", CHAT_PROMPT, 5)], waiting=waiting, free_blocks=8)
    assert decide(p, state).num_tokens["c1"] == CHAT_PROMPT  # 7 of the 8 free blocks


def test_bad_reserve_is_a_one_line_error() -> None:
    with pytest.raises(ValueError, match="ttft_kv_reserve_requests must be >= 0, got -1"):
        SuperInferPolicy(ttft_kv_reserve_requests=-1)


def test_a_chunked_admission_counts_its_whole_prompt() -> None:
    # a 64-token step admits the batch's first chunk (4 blocks), but its later chunks would take
    # the other 6 blocks as a running request's: the reserve check charges all 10 at admission
    chat = [decoding("c0", CHAT_PROMPT, 5)]
    waiting = [make_view("b", prompt=BATCH_PROMPT, max_output=10, slo=BATCH)]
    for free, admitted in ((49, False), (50, True)):
        state = make_state(running=chat, waiting=waiting, free_blocks=free, token_budget=64)
        tokens = decide(_policy(), state).num_tokens
        assert tokens.get("b", 0) == (63 if admitted else 0)  # the budget less c0's decode
