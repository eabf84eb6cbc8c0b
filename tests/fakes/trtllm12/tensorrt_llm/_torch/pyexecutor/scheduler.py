"""Double of ``tensorrt_llm._torch.pyexecutor.scheduler`` (1.2.x): names and signatures of §1.1.

``BindCapacityScheduler`` and ``BindMicroBatchScheduler`` keep their constructor signatures and
delegate to the pure-Python references in ``tensorrt_llm.bindings.internal.algorithms`` where the
real ones call C++.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections import namedtuple
from dataclasses import dataclass
from typing import Any

from tensorrt_llm.bindings import internal as tb_internal
from tensorrt_llm.llmapi.llm_args import CapacitySchedulerPolicy

from .llm_request import LlmRequest, LlmRequestState

__all__ = [
    "BindCapacityScheduler",
    "BindMicroBatchScheduler",
    "CapacityScheduler",
    "GuaranteedNoEvictScheduler",
    "MicroBatchScheduler",
    "RequestList",
    "RequestScheduler",
    "ScheduledRequests",
    "SchedulerOutput",
    "SerializableSchedulerOutput",
    "SimpleScheduler",
]

RequestList = list[LlmRequest]

SchedulerOutput = namedtuple(
    "SchedulerOutput",
    [
        "context_requests",
        "generation_requests",
        "paused_requests",
        "fitting_disagg_gen_init_requests",
        "num_fitting_requests",
    ],
)


class ScheduledRequests:
    def __init__(self) -> None:
        self.context_requests: RequestList = []
        self.generation_requests: RequestList = []
        self.paused_requests: RequestList = []

    @property
    def is_generation_only(self) -> bool:
        return not self.context_requests and all(
            not r.py_draft_tokens for r in self.generation_requests
        )

    @property
    def can_run_cuda_graph(self) -> bool:
        return not self.context_requests

    @property
    def batch_size(self) -> int:
        return len(self.context_requests) + len(self.generation_requests)

    def all_requests(self) -> RequestList:
        return self.context_requests + self.generation_requests


class RequestScheduler(ABC):
    @abstractmethod
    def schedule_request(
        self, active_requests: RequestList, inflight_request_ids: set[int]
    ) -> SchedulerOutput:
        raise NotImplementedError

    @abstractmethod
    def can_schedule(self, requests: RequestList) -> bool:
        raise NotImplementedError


@dataclass
class SerializableSchedulerOutput:
    context_requests: list[int]
    generation_requests: list[int]
    paused_requests: list[int]
    fitting_disagg_gen_init_requests: list[int]
    num_fitting_requests: int


class CapacityScheduler(ABC):
    @abstractmethod
    def schedule_request(
        self, active_requests: RequestList
    ) -> tuple[RequestList, RequestList, RequestList]:
        raise NotImplementedError


class BindCapacityScheduler(CapacityScheduler):
    def __init__(
        self,
        max_num_requests: int,
        kv_cache_manager: Any,
        peft_cache_manager: Any,
        scheduler_policy: CapacitySchedulerPolicy = CapacitySchedulerPolicy.GUARANTEED_NO_EVICT,
        two_step_lookahead: bool = False,
    ) -> None:
        super().__init__()
        self.kv_cache_manager = kv_cache_manager
        self.peft_cache_manager = peft_cache_manager
        self.impl = tb_internal.algorithms.CapacityScheduler(
            max_num_requests=max_num_requests,
            capacity_scheduler_policy=scheduler_policy._to_pybind(),
            has_kv_cache_manager=kv_cache_manager is not None,
            two_step_lookahead=two_step_lookahead,
            no_schedule_until_state=LlmRequestState.CONTEXT_INIT,
            no_schedule_after_state=LlmRequestState.GENERATION_COMPLETE,
        )

    def schedule_request(
        self, active_requests: RequestList
    ) -> tuple[RequestList, RequestList, RequestList]:
        return self.impl(active_requests, self.kv_cache_manager, self.peft_cache_manager)


class GuaranteedNoEvictScheduler(CapacityScheduler):
    """The pure-Python reference example of 1.2 (not used by default)."""

    def __init__(self, max_num_requests: int, kv_cache_manager: Any) -> None:
        self.kv_cache_manager = kv_cache_manager
        self.impl = tb_internal.algorithms.CapacityScheduler(
            max_num_requests, CapacitySchedulerPolicy.GUARANTEED_NO_EVICT, True
        )

    def schedule_request(
        self, active_requests: RequestList
    ) -> tuple[RequestList, RequestList, RequestList]:
        return self.impl(active_requests, self.kv_cache_manager)


class MicroBatchScheduler(ABC):
    @abstractmethod
    def schedule(
        self, active_requests: RequestList, inflight_request_ids: set[int]
    ) -> tuple[RequestList, RequestList]:
        raise NotImplementedError


class BindMicroBatchScheduler(MicroBatchScheduler):
    def __init__(
        self,
        max_batch_size: int,
        max_num_tokens: int | None = None,
        ctx_chunk_config: tuple[Any, int] | None = None,
    ) -> None:
        super().__init__()
        self.max_batch_size = max_batch_size
        self.max_num_tokens = max_num_tokens
        self.impl = tb_internal.algorithms.MicroBatchScheduler(ctx_chunk_config, max_num_tokens)

    def schedule(
        self, active_requests: RequestList, inflight_request_ids: set[int]
    ) -> tuple[RequestList, RequestList]:
        return self.impl(
            active_requests, inflight_request_ids, self.max_batch_size, self.max_num_tokens
        )


class SimpleScheduler(RequestScheduler):
    def __init__(
        self, capacity_scheduler: CapacityScheduler, micro_batch_scheduler: MicroBatchScheduler
    ) -> None:
        super().__init__()
        self.capacity_scheduler = capacity_scheduler
        self.micro_batch_scheduler = micro_batch_scheduler

    def schedule_request(
        self, active_requests: RequestList, inflight_request_ids: set[int]
    ) -> SchedulerOutput:
        fitting, fitting_disagg, paused = self.capacity_scheduler.schedule_request(active_requests)
        context_requests, generation_requests = self.micro_batch_scheduler.schedule(
            fitting, inflight_request_ids
        )
        return SchedulerOutput(
            list(context_requests),
            list(generation_requests),
            list(paused),
            list(fitting_disagg),
            len(fitting),
        )

    def can_schedule(self, requests: RequestList) -> bool:
        fitting, _, _ = self.capacity_scheduler.schedule_request(requests)
        return len(fitting) == len(requests)
