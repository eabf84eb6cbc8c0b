"""Double of ``tensorrt_llm._torch.pyexecutor``."""
