"""Double of ``tensorrt_llm.executor.base_worker`` (1.2.x): where the engine is built.

``setup_engine`` imports ``create_py_executor`` at call time, as the real one does, so a patch of
``py_executor_creator`` applied before it runs reaches the executor.
"""

from __future__ import annotations

from typing import Any

__all__ = ["BaseWorker"]


class BaseWorker:
    def __init__(self, llm_args: Any) -> None:
        self.llm_args = llm_args
        self.engine: Any = None

    def setup_engine(self) -> None:
        from tensorrt_llm._torch.pyexecutor.py_executor_creator import create_py_executor

        self.engine = create_py_executor(
            llm_args=self.llm_args, checkpoint_dir=None, tokenizer=None
        )
