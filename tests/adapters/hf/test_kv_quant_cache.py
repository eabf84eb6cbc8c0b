"""KIVICacheLayer on a tiny random Llama: rows keep their own storage format."""

from __future__ import annotations

import pytest

from tests.adapters.hf.conftest import require

# fail, not skip, under `make test` (tests.adapters.hf.conftest.required)
torch = require("torch", "needs the `hf` extra")
transformers = require("transformers", "needs the `hf` extra")

from superinfer.adapters.hf.kv_quant_cache import KVFormat, make_kivi_cache  # noqa: E402
from superinfer.kernels import KVKind, dequantize_kv_ref, quantize_kv_ref  # noqa: E402
from superinfer.policy_core.kv_bytes import kv_sequence_bytes  # noqa: E402
from superinfer.policy_core.types import KVPrecision  # noqa: E402

# transformers >= 5.24 renames the forward argument to `cache`; `past_key_values` works on all 5.x.
pytestmark = pytest.mark.filterwarnings("ignore:`past_key_values` is deprecated:FutureWarning")

GROUP = 8
FORMATS = [
    KVFormat(None),
    KVFormat(KVPrecision.FP16),
    KVFormat(KVPrecision.INT8, GROUP),
    KVFormat(KVPrecision.INT4, GROUP),
]


@pytest.fixture(scope="module")
def model() -> transformers.LlamaForCausalLM:
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=64, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=128,
    )  # fmt: skip
    return transformers.LlamaForCausalLM(config).eval()


def _run(model, cache, prompt: torch.Tensor, steps: torch.Tensor) -> list[torch.Tensor]:  # noqa: ANN001
    rows = len(cache.layers[0].formats) if hasattr(cache.layers[0], "formats") else 1
    logits = [model(input_ids=prompt, past_key_values=cache, use_cache=True).logits[:, -1]]
    for token in steps:
        ids = token.view(1, 1).expand(rows, 1)
        logits.append(model(input_ids=ids, past_key_values=cache, use_cache=True).logits[:, -1])
    return logits


def test_rows_store_their_format_and_the_reference_row_is_untouched(model) -> None:  # noqa: ANN001
    prompt = torch.randint(0, 64, (1, 13))
    steps = torch.randint(0, 64, (6,))  # 19 tokens: 2 whole groups of 8, residual 3
    with torch.inference_mode():
        plain = _run(model, transformers.DynamicCache(config=model.config), prompt, steps)
        cache = make_kivi_cache(model.config.num_hidden_layers, FORMATS)
        mixed = _run(model, cache, prompt, steps)
    for want, got in zip(plain, mixed, strict=True):
        torch.testing.assert_close(got[0], want[0], atol=1e-5, rtol=1e-5)  # row 0: unquantized
    assert not torch.equal(mixed[-1][3], mixed[-1][0])  # int4 storage changed the logits

    layer = cache.layers[0]
    n = layer.get_seq_length()
    assert n == 19 and layer.quantized_tokens == [0, 0, 16, 16]
    raw_k = layer.keys[0]  # [heads, tokens, head_dim], exact
    for row, bits in ((2, 8), (3, 4)):
        x = raw_k[:, :16].transpose(0, 1).contiguous()
        want = dequantize_kv_ref(quantize_kv_ref(x, KVKind.KEY, bits, GROUP), torch.float32)
        assert torch.equal(layer.keys[row][:, :16], want.transpose(0, 1))
        assert torch.equal(layer.keys[row][:, 16:], raw_k[:, 16:])  # residual kept exact
        residual_bytes = (n - 16) * 2 * 16 * 2 * 2  # tokens * heads * head_dim * K,V * fp16
        precision = FORMATS[row].precision
        assert layer.quantized_bytes[row] + residual_bytes == kv_sequence_bytes(
            n, 1, 2, 16, precision, GROUP
        )
    assert torch.equal(layer.keys[1], raw_k.half().float())


def test_batch_must_match_the_row_formats(model) -> None:  # noqa: ANN001
    cache = make_kivi_cache(model.config.num_hidden_layers, FORMATS)
    with torch.inference_mode():
        model(input_ids=torch.randint(0, 64, (1, 4)), past_key_values=cache, use_cache=True)
        with pytest.raises(ValueError, match="does not fit 4 row formats"):
            model(input_ids=torch.randint(0, 64, (2, 1)), past_key_values=cache, use_cache=True)
    with pytest.raises(ValueError, match="group_size is needed exactly"):
        KVFormat(KVPrecision.INT4)
