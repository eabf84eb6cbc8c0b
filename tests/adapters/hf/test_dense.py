"""SmolLM2's dense copy (``adapters/hf/dense.py``, ``dense_build.py``): the installed copy is the
GGUF's model, the engine loads it, and a copy from another file, another format or half written
is never loaded."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from superinfer.adapters.hf import dense, dense_build
from tests.adapters.hf.conftest import require, required


def _stamp(folder: Path, gguf: Path, **changes: Any) -> None:
    stamp = {"format": 1, "gguf": dense.gguf_fingerprint(gguf), "dtype": "float32"}
    assert stamp == dense.dense_stamp(gguf)
    (folder / ".superinfer-source.json").write_text(json.dumps(stamp | changes))


def test_a_copy_is_trusted_only_with_its_weights_and_a_stamp_naming_this_gguf(
    tmp_path: Path,
) -> None:
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF" + bytes(range(256)))
    folder = tmp_path / "dense"
    folder.mkdir()
    assert dense.gguf_fingerprint(gguf) == {
        "file": "m.gguf",
        "bytes": 260,
        "sha256": "f4f8a77f6da5ff58f4b9b29db8a2886c5958a123536dc877bbec713673714887",
    }
    assert dense.dense_copy(gguf, folder) is None  # nothing there
    _stamp(folder, gguf)
    assert dense.dense_copy(gguf, folder) is None  # stamp but no weights: half written
    (folder / "model.safetensors").write_bytes(b"")
    assert dense.dense_copy(gguf, folder) == folder
    other = tmp_path / "other.gguf"
    other.write_bytes(b"GGUF" + bytes(range(255)))
    assert dense.dense_copy(other, folder) is None  # made from another file
    _stamp(folder, gguf, format=2)
    assert dense.dense_copy(gguf, folder) is None  # another layout
    _stamp(folder, gguf, dtype="bfloat16")
    assert dense.dense_copy(gguf, folder) is None
    (folder / ".superinfer-source.json").write_text("{not json")
    assert dense.dense_copy(gguf, folder) is None
    (folder / ".superinfer-source.json").write_text("[1, 2]")
    assert dense.dense_copy(gguf, folder) is None


def test_the_check_names_every_tensor_and_text_that_differs() -> None:
    torch = require("torch")
    transformers = require("transformers")
    from superinfer.adapters.hf.engine import LoadedModel

    cfg = transformers.LlamaConfig(
        vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
        num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=32,
    )  # fmt: skip

    class Tok:
        def __init__(self, shift: int, template: str) -> None:
            self.shift, self.template = shift, template

        def __call__(self, text: str) -> dict[str, list[int]]:
            return {"input_ids": [len(text) + (self.shift if "é" in text else 0)]}

        def apply_chat_template(self, chat: list[dict[str, str]], **_: Any) -> str:
            return self.template + chat[-1]["content"]

    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(cfg)
    twin = transformers.LlamaForCausalLM(cfg)
    twin.load_state_dict(model.state_dict())
    a = LoadedModel("m", model, Tok(0, "<u>"), "float32", 0.0, 32)
    assert (
        dense_build.differences(a, LoadedModel("m", twin, Tok(0, "<u>"), "float32", 0.0, 32)) == []
    )
    with torch.no_grad():
        twin.model.layers[0].mlp.down_proj.weight[3, 5] += 1e-6
    b = LoadedModel("m", twin, Tok(1, "<user>"), "float32", 0.0, 32)
    assert dense_build.differences(a, b) == [
        "model.layers.0.mlp.down_proj.weight",
        repr(dense_build.PROBE_TEXTS[2]),
        "chat template",
    ]


def test_the_installed_copy_is_the_ggufs_weights_and_the_engine_loads_it(smollm2: Any) -> None:
    """Two tensors read from the GGUF by the ``gguf`` package's own reader and dequantizer (not
    transformers, which the build compared every tensor with) equal the copy's bit for bit."""
    torch = require("torch")
    require("gguf")
    from gguf import GGUFReader
    from gguf.quants import dequantize
    from safetensors import safe_open

    from superinfer.adapters.hf.engine import smollm2_gguf_path

    gguf = smollm2_gguf_path()
    folder = dense.dense_copy(gguf)
    if folder is None and not required():
        pytest.skip("no dense copy installed: make install-hf")
    assert folder == dense.default_dense_dir()
    assert smollm2.source == folder
    tensors = {t.name: t for t in GGUFReader(gguf).tensors}
    with safe_open(str(folder / "model.safetensors"), "pt") as copy:
        for gguf_name, kind, name, shape in (
            ("token_embd.weight", "Q8_0", "model.embed_tokens.weight", (49152, 576)),
            ("blk.29.ffn_down.weight", "Q4_1", "model.layers.29.mlp.down_proj.weight", (576, 1536)),
        ):
            t = tensors[gguf_name]
            assert t.tensor_type.name == kind
            want = torch.from_numpy(dequantize(t.data, t.tensor_type).copy())
            got = copy.get_tensor(name)
            assert (got.dtype, tuple(got.shape)) == (torch.float32, shape)
            assert torch.equal(got, want), name


def test_a_damaged_copy_warns_naming_it_and_the_gguf_is_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A copy whose stamp matches but whose weights are garbage (damaged after the build): the
    load warns, naming the folder and the error, and reads the GGUF (stubbed here: its load
    takes 20 s)."""
    require("transformers")
    from superinfer.adapters.hf import engine

    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF")
    folder = tmp_path / "dense"
    folder.mkdir()
    (folder / "model.safetensors").write_bytes(b"not a safetensors file")
    (folder / "config.json").write_text('{"model_type": "llama"}')
    _stamp(folder, gguf)
    read: list[tuple[Path, str]] = []
    monkeypatch.setattr(engine, "smollm2_gguf_path", lambda: gguf)
    monkeypatch.setattr(engine, "dense_copy", lambda path: dense.dense_copy(path, folder))
    monkeypatch.setattr(engine, "load_gguf", lambda path, dtype: read.append((path, dtype)) or 7)
    engine.load_smollm2.cache_clear()
    try:
        with pytest.warns(RuntimeWarning) as caught:
            assert engine.load_smollm2("float32") == 7
    finally:
        engine.load_smollm2.cache_clear()
    assert read == [(gguf, "float32")]
    (message,) = [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)]
    assert message.startswith(f"SmolLM2's dense copy in {folder} cannot be loaded (")
    assert message.endswith("reading the GGUF instead (`make install-hf` rebuilds the copy)")
    assert "\n" not in message
