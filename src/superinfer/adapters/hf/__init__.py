"""transformers (``hf``) engine glue, and a transformers KV cache stored through our kernels."""
