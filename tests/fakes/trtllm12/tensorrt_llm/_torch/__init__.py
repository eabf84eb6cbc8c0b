"""Double of ``tensorrt_llm._torch`` (PyTorch backend)."""
