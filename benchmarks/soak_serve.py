"""Bounded soak of ``superinfer serve --engine hf`` on 127.0.0.1 (issue 20).

Starts the server (``python -m superinfer serve --engine hf --policy POLICY --host 127.0.0.1``,
as a user would), waits for ``/health``, then for ``--minutes`` keeps ``--concurrency`` clients
sending a seeded mix of requests:

* valid: completions, chat completions, streamed completions (1-16 tokens);
* invalid: bodies that are not JSON, wrong types, unknown SLO classes, prompts longer than the
  context, and the SLO that used to kill the server (``tpot_ms: 1.7e308``, issue 20 item 1);
* abandoned: a long non-streamed or streamed request (``max_tokens`` 64, ``ignore_eos``) whose
  client closes its socket after 0.2-1.5 s, without reading the answer.

At the end it reads ``/metrics`` (after waiting up to 10 s for the engine to drain), the server's
RSS (``/proc/PID/status`` ``VmRSS``) at the start and end, stops the server with SIGINT and
writes ``OUT`` (default ``results/reliability/soak.csv``): one ``metric,value`` row each: the
run's settings, requests sent per kind, answers per status, errors by kind, RSS, and the
engine's KV blocks, queues and ``superinfer_engine_up`` at the end.

Usage::

    python benchmarks/soak_serve.py [--minutes 30] [--policy superinfer] [--concurrency 4]
        [--seed 0] [--out results/reliability/soak.csv] [--log FILE]

Linux only (reads ``/proc``); 127.0.0.1 only.
"""

from __future__ import annotations

import argparse
import asyncio
import csv
import json
import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

HOST = "127.0.0.1"
#: Mix of request kinds and their weights (valid ~60 %, invalid ~25 %, abandoned ~15 %).
KINDS = {
    "valid_completion": 30,
    "valid_chat": 15,
    "valid_stream": 15,
    "invalid_json": 4,
    "invalid_types": 5,
    "invalid_slo_class": 4,
    "invalid_too_long": 4,
    "extreme_slo": 8,
    "abandoned_whole": 10,
    "abandoned_stream": 5,
}
PROMPTS = ("The capital of France is", "Write a haiku about rain.", "1, 2, 3, 4,", "Hello")


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now."""
    with socket.socket() as s:
        s.bind((HOST, 0))
        return int(s.getsockname()[1])


def rss_mib(pid: int) -> float:
    """Resident set size of ``pid``, MiB (``/proc/PID/status`` ``VmRSS``, kB)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for pid {pid}")


def body_of(kind: str, rng: random.Random) -> tuple[str, bytes, bool]:
    """``(path, body, abandon)`` of one request of ``kind``."""
    prompt = rng.choice(PROMPTS)
    n = rng.randint(1, 16)
    path = "/v1/completions"
    if kind == "valid_completion":
        b: Any = {"prompt": prompt, "max_tokens": n, "slo": rng.choice(["chat", "batch"])}
    elif kind == "valid_chat":
        path = "/v1/chat/completions"
        b = {"messages": [{"role": "user", "content": prompt}], "max_tokens": n}
    elif kind == "valid_stream":
        b = {"prompt": prompt, "max_tokens": n, "stream": True, "ignore_eos": True}
    elif kind == "invalid_json":
        return path, b'{"prompt": "x", "max_tokens": ', False
    elif kind == "invalid_types":
        b = rng.choice([{"prompt": 5}, {"prompt": "x", "max_tokens": "8"}, [1, 2], {"stream": 1}])
    elif kind == "invalid_slo_class":
        b = {"prompt": prompt, "slo": "gold"}
    elif kind == "invalid_too_long":
        b = {"prompt": list(range(100, 9100)), "max_tokens": 4}
    elif kind == "extreme_slo":
        b = {"prompt": prompt, "max_tokens": 8, "slo": {"class": "chat", "tpot_ms": 1.7e308}}
    else:  # abandoned
        b = {"prompt": prompt, "max_tokens": 64, "ignore_eos": True}
        b["stream"] = kind == "abandoned_stream"
        return path, json.dumps(b).encode(), True
    return path, json.dumps(b).encode(), False


async def send(port: int, path: str, body: bytes, abandon_after_s: float | None) -> str:
    """One HTTP/1.1 request over its own socket; the answer's status, or what went wrong
    (``abandoned``, ``connection_error: ...``)."""
    try:
        reader, writer = await asyncio.open_connection(HOST, port)
    except OSError as exc:
        return f"connection_error: {type(exc).__name__}"
    head = (
        f"POST {path} HTTP/1.1\r\nhost: {HOST}\r\ncontent-type: application/json\r\n"
        f"content-length: {len(body)}\r\nconnection: close\r\n\r\n"
    ).encode()
    try:
        writer.write(head + body)
        await writer.drain()
        if abandon_after_s is not None:
            await asyncio.sleep(abandon_after_s)
            return "abandoned"
        status_line = await asyncio.wait_for(reader.readline(), 600)
        await asyncio.wait_for(reader.read(), 600)  # the rest, to the close
        parts = status_line.split()
        return parts[1].decode() if len(parts) > 1 else "no_status"
    except (OSError, asyncio.TimeoutError) as exc:
        return f"connection_error: {type(exc).__name__}"
    finally:
        writer.close()


async def http_get(port: int, path: str) -> tuple[int, str]:
    """``GET path``: (status, body text); (0, reason) if it cannot connect."""
    try:
        reader, writer = await asyncio.open_connection(HOST, port)
    except OSError as exc:
        return 0, type(exc).__name__
    writer.write(f"GET {path} HTTP/1.1\r\nhost: {HOST}\r\nconnection: close\r\n\r\n".encode())
    await writer.drain()
    data = await reader.read()
    writer.close()
    head, _, text = data.partition(b"\r\n\r\n")
    parts = head.split(b"\r\n", 1)[0].split()
    return (int(parts[1]) if len(parts) > 1 else 0), text.decode(errors="replace")


def metric(text: str, name: str, labels: str = "") -> float | None:
    """The value of one sample in Prometheus text (``name{labels} value``)."""
    key = f"{name}{{{labels}}}" if labels else name
    for line in text.splitlines():
        if line.startswith(key + " "):
            return float(line.split()[-1])
    return None


async def soak(args: argparse.Namespace, port: int, pid: int) -> dict[str, Any]:
    rng = random.Random(args.seed)
    kinds, weights = list(KINDS), list(KINDS.values())
    sent: Counter[str] = Counter()
    answers: Counter[str] = Counter()
    deadline = time.monotonic() + args.minutes * 60

    async def client() -> None:
        while time.monotonic() < deadline:
            kind = rng.choices(kinds, weights)[0]
            path, body, abandon = body_of(kind, rng)
            sent[kind] += 1
            after = rng.uniform(0.2, 1.5) if abandon else None
            outcome = await send(port, path, body, after)
            answers[f"{kind}:{outcome}"] += 1

    rss_start = rss_mib(pid)
    await asyncio.gather(*(client() for _ in range(args.concurrency)))
    kv = running = waiting = None
    text = ""
    for _ in range(100):  # let the engine drain the abandoned requests (up to 10 s)
        _, text = await http_get(port, "/metrics")
        kv = metric(text, "superinfer_kv_used_blocks")
        running = metric(text, "superinfer_requests_running", 'tier="0"')
        waiting = metric(text, "superinfer_requests_waiting", 'tier="0"')
        if kv == 0 and not running and not waiting:
            break
        await asyncio.sleep(0.1)
    health, _ = await http_get(port, "/health")
    failed: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith("superinfer_requests_failed_total{"):
            inside = line.split("{", 1)[1].split("}", 1)[0].replace('"', "")
            labels = dict(pair.split("=", 1) for pair in inside.split(","))
            key = f"{labels['kind']}:{labels['slo_class']}"
            failed[key] = float(line.split()[-1])
    return {
        "sent": sent,
        "answers": answers,
        "rss_start": rss_start,
        "rss_end": rss_mib(pid),
        "kv": kv,
        "running": running,
        "waiting": waiting,
        "up": metric(text, "superinfer_engine_up"),
        "policy_errors": metric(text, "superinfer_policy_errors_total"),
        "failed": failed,
        "health": health,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=30.0, help="soak length [30]")
    parser.add_argument("--policy", default="superinfer", help="serve --policy [superinfer]")
    parser.add_argument("--concurrency", type=int, default=4, help="clients at once [4]")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=Path("results/reliability/soak.csv"))
    parser.add_argument("--log", type=Path, default=None, help="server log [a temporary file]")
    args = parser.parse_args()
    if not args.minutes > 0 or args.concurrency < 1:
        parser.error("--minutes must be > 0 and --concurrency >= 1")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    log = args.log or Path(tempfile.mkstemp(prefix="soak-serve-", suffix=".log")[1])
    port = free_port()
    cmd = [sys.executable, "-m", "superinfer", "serve", "--engine", "hf", "--policy", args.policy,
           "--host", HOST, "--port", str(port)]  # fmt: skip
    started = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime())
    with log.open("w") as fh:
        proc = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT)
    try:
        t0 = time.monotonic()
        while asyncio.run(http_get(port, "/health"))[0] != 200:
            if proc.poll() is not None or time.monotonic() - t0 > 600:
                print(f"soak: the server did not come up; see {log}", file=sys.stderr)
                return 1
            time.sleep(1)
        print(f"soak: server up on {HOST}:{port} (pid {proc.pid}); {args.minutes} min", flush=True)
        result = asyncio.run(soak(args, port, proc.pid))
        alive = proc.poll() is None
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
    rows: list[tuple[str, Any]] = [
        ("started_utc", started),
        ("minutes", args.minutes),
        ("policy", args.policy),
        ("concurrency", args.concurrency),
        ("seed", args.seed),
        ("cpus", os.cpu_count()),
        ("load_avg_1min_end", f"{os.getloadavg()[0]:.2f}"),
        ("requests_sent", sum(result["sent"].values())),
    ]
    rows += [(f"sent:{k}", result["sent"][k]) for k in KINDS]
    rows += [(f"answer:{k}", v) for k, v in sorted(result["answers"].items())]
    rows += [(f"engine_failed:{k}", int(v)) for k, v in sorted(result["failed"].items())]
    rows += [
        ("policy_errors_total", result["policy_errors"]),
        ("rss_start_mib", f"{result['rss_start']:.1f}"),
        ("rss_end_mib", f"{result['rss_end']:.1f}"),
        ("kv_used_blocks_end", result["kv"]),
        ("requests_running_end", result["running"]),
        ("requests_waiting_end", result["waiting"]),
        ("engine_up_end", result["up"]),
        ("health_status_end", result["health"]),
        ("server_alive_end", int(alive)),
        ("server_exit_code", proc.returncode),  # 130: stopped by our SIGINT
    ]
    with args.out.open("w", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(["metric", "value"])
        writer.writerows(rows)
    print(f"soak: wrote {args.out} (server log {log})")
    return 0 if alive and result["health"] == 200 and result["kv"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
