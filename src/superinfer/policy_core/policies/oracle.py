"""``oracle``: a clairvoyant upper bound that knows every request's true output length."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from superinfer.policy_core.policies.superinfer import SuperInferPolicy
from superinfer.policy_core.policies.superinfer.config import _opt
from superinfer.policy_core.types import RequestView

__all__ = ["OraclePolicy"]


@dataclass
class OraclePolicy(SuperInferPolicy):
    """Least slack first with admission control, given the true output lengths.

    The rotation scheduler with perfect information: wherever ``superinfer`` predicts how many
    output tokens a request still has (the least-slack order of deadline classes, deadline-aware
    promotion, the TPOT credit of decodes), the oracle uses the **true** remaining output
    (``output_tokens[request_id] - generated_tokens``). Admission control rejects a waiting
    request as soon as it can no longer meet its SLO under any schedule (reason
    ``"slo_unattainable"``) instead of keeping it as best effort, and nothing is aged, since an
    upper bound on attainment owes nothing to requests that cannot attain. Requests with a TTFT
    target are ordered by their TTFT deadline, as in ``superinfer``: their slack does not depend
    on output length, and for them earliest deadline first is the optimal order while every
    deadline can be met (Liu and Layland, JACM 1973).

    Only this policy may read true output lengths; the harness builds it from the workload
    (``superinfer.harness.policies.build_policy``). It bounds what better length prediction and
    load shedding could add to ``superinfer``; it is not a deployable policy.

    Args:
        output_tokens: request id -> true output length, tokens; every request the policy sees
            must be in it.

    Raises:
        ValueError: ``output_tokens`` is empty (the policy cannot be built from options alone),
            or any hyperparameter is invalid.
        KeyError: at a decision, a request missing from ``output_tokens``.
    """

    output_tokens: Mapping[str, int] = field(
        default_factory=dict,
        metadata={"help": "request id -> true output length (set by the harness, not an option)"},
    )
    aging: bool = _opt(False, "lift long-queued requests above all (off: an upper bound)")
    reject_hopeless: bool = _opt(True, "reject waiting requests that can no longer meet their SLO")
    needs_output_lengths = True  # class attribute, not a field: the harness reads it
    name: str = "oracle"

    def __post_init__(self) -> None:
        if not self.output_tokens:
            raise ValueError(
                "oracle needs the true output length of every request: construct it with "
                "OraclePolicy(output_tokens={request_id: tokens}); `superinfer bench` does this "
                "from the workload"
            )
        super().__post_init__()

    def _true_remaining(self, view: RequestView) -> float:
        total = self.output_tokens.get(view.request_id)
        if total is None:
            raise KeyError(f"oracle: no true output length for request {view.request_id!r}")
        return float(max(total - view.generated_tokens, 1))

    def remaining_output_tokens(self, view: RequestView) -> float:
        return self._true_remaining(view)

    def credit_tokens(self, view: RequestView, quantile: float | None = None) -> float:
        return self._true_remaining(view)  # known: no quantile needed
