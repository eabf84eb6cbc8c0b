"""Discrete-event simulator of LLM serving engines, driven by the same hooks as real engines."""
