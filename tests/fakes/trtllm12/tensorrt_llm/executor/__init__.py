"""Double of ``tensorrt_llm.executor``."""
