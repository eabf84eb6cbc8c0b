"""Workload spec files (TOML): sources, SLO classes, mixing, time window, rate scaling, arrivals.

A spec describes a workload once; ``superinfer bench --workload FILE|NAME`` runs it. Built-in
specs live in ``harness/workload/workloads/*.toml`` (``azure-mixed``, ``mooncake-chat``,
``sharegpt-poisson``). The format is documented in ``docs/workloads.md``; in short::

    name = "my-mix"
    duration_s = 600              # window on the run clock, after rate scaling (optional)
    rate_scale = 1.0              # every source's arrival rate is multiplied by this

    [slo.chat]                    # SLO classes: ttft_ms, tpot_ms, deadline_s, weight, priority,
    ttft_ms = 1000                # ttft_ms_per_1k_prompt, ttft_x_isolated, tpot_x_isolated
    tpot_ms = 100

    [[source]]                    # one table per source; mixed on one clock
    name = "conv"
    format = "azure"              # or mooncake, sharegpt-lengths, sharegpt-prompts, csv, jsonl
    file = "AzureLLMInferenceTrace_conv.csv"
    slo = "chat"                  # a class above, or the built-in "chat" / "batch"
    arrivals = {process = "poisson", rate_rps = 4.0}   # or "trace" (the file's own times)

Every malformed key is reported as one line, ``FILE:LINE: field 'source[0].arrivals.rate_rps':
problem``. tomllib does not keep key positions, so lines are found by a small scanner over the
text (:class:`_KeyLines`) that understands table headers, arrays of tables and ``key =`` lines;
a key inside an inline table is reported at its table's line.
"""

from __future__ import annotations

import math
import re
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from superinfer.harness.errors import SpecError, UserError
from superinfer.harness.workload.limits import (
    MAX_DURATION_S,
    MAX_RATE_RPS,
    MAX_RATE_SCALE,
    MAX_REPLICAS,
    MAX_REQUESTS,
    MAX_TOKENS,
    MAX_TP,
)
from superinfer.harness.workload.traces import (
    TIME_UNITS,
    ColumnMap,
)
from superinfer.harness.workload.workload import BATCH_SLO, CHAT_SLO
from superinfer.policy_core.slo_forms import SLO_FORMS
from superinfer.policy_core.types import SLO

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

__all__ = [
    "BENCH_KEYS",
    "FORMATS",
    "ArrivalSpec",
    "SourceSpec",
    "WorkloadSpec",
    "builtin_specs",
    "load_workload_spec",
    "parse_spec",
]

#: Source formats: (has arrival times, has output lengths, default file).
FORMATS: dict[str, tuple[bool, bool, str | None]] = {
    "azure": (True, True, None),
    "mooncake": (True, True, "conversation_trace.jsonl"),
    "sharegpt-lengths": (False, True, "sharegpt_8k_filtered_stats_llama2_tokenizer.csv"),
    "sharegpt-prompts": (False, False, "ShareGPT_V3_filtered_500.json"),
    "csv": (True, True, None),
    "jsonl": (True, True, None),
}

#: Keys of the optional ``[bench]`` table: the serving setup the workload was sized for.
#: ``superinfer bench`` uses them where the command line leaves the option at its default.
BENCH_KEYS = {
    "model": str,
    "gpu": str,
    "tp": int,
    "replicas": int,
    "router": str,
    "engines": str,
    "policies": str,
}

#: Built-in SLO classes a spec may name without defining them.
BUILTIN_SLOS = {"chat": CHAT_SLO, "batch": BATCH_SLO}

_TOP_KEYS = {"name", "description", "rate_scale", "start_s", "duration_s", "clock"}
_TOP_TABLES = {"slo", "source", "bench"}
_SLO_FORMS = SLO_FORMS  # prompt-scaled TTFT and engine-relative targets
_SLO_KEYS = {"ttft_ms", "tpot_ms", "deadline_s", "weight", "priority", *_SLO_FORMS}
_SOURCE_KEYS = {
    "name",
    "format",
    "file",
    "slo",
    "max_output_tokens",
    "output_tokens",
    "rate_scale",
    "num_requests",
    "order",
    "arrivals",
    "columns",
}
_ARRIVAL_KEYS = {"process", "rate_rps", "burstiness", "spread"}
_COLUMN_KEYS = {
    "arrival",
    "prompt_tokens",
    "output_tokens",
    "block_hashes",
    "prompt",
    "time_unit",
    "hash_block_tokens",
}
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")


@dataclass(frozen=True, slots=True)
class ArrivalSpec:
    """How a source's requests arrive.

    Attributes:
        process: ``"trace"`` (the file's own times), ``"poisson"`` or ``"gamma"``.
        rate_rps: mean rate of a synthetic process, requests/s (before rate scaling).
        burstiness: gamma shape (vLLM's ``--burstiness``); 1 for Poisson.
        spread: for ``trace``: ``"uniform"`` spreads requests sharing a quantized timestamp
            over its bucket (:func:`~superinfer.harness.workload.arrivals.spread_buckets`),
            ``"none"``
            keeps the bursts.
    """

    process: str = "trace"
    rate_rps: float | None = None
    burstiness: float = 1.0
    spread: str = "none"


@dataclass(frozen=True, slots=True)
class SourceSpec:
    """One source of a workload spec.

    Attributes:
        name: short name; request ids are ``NAME-LINE`` (trace arrivals) or ``NAME-I``.
        format: one of :data:`FORMATS`.
        file: the data file: a path (relative to the spec's folder), or a name looked up in
            the shared data folder (:func:`superinfer.harness.workload.data.trace_path`).
        slo: SLO class of its requests.
        arrivals: arrival process.
        max_output_tokens: the ``max_tokens`` requests declare (a longer true output is used
            instead); ``None``: the longest output in the source.
        output_tokens: fixed output length for files without one (prompt sets).
        rate_scale: this source's rate multiplier (on top of the workload's).
        num_requests: cap on requests (synthetic arrivals need this or a window).
        order: which rows synthetic arrivals take: ``"shuffle"`` (a seeded permutation,
            reshuffled each pass) or ``"file"`` (file order, wrapping).
        columns: column mapping of ``csv``/``jsonl`` files.
        line: line of the source's table in the spec, for error messages.
    """

    name: str
    format: str
    file: str
    slo: SLO
    arrivals: ArrivalSpec
    max_output_tokens: int | None = None
    output_tokens: int | None = None
    rate_scale: float = 1.0
    num_requests: int | None = None
    order: str = "shuffle"
    columns: ColumnMap | None = None
    line: int | None = None


@dataclass(frozen=True, slots=True)
class WorkloadSpec:
    """A parsed, validated workload spec.

    Attributes:
        name: workload name (reports, manifest).
        description: one paragraph for the report.
        sources: the sources, mixed by superposition on one clock.
        rate_scale: arrival-rate multiplier of every source.
        start_s: start of the window on the run clock (s, after scaling); the window is shifted
            to start at 0.
        duration_s: window length (s, after scaling), ``None``: everything.
        clock: ``"shared"``: trace sources keep their offsets from the earliest request of any
            trace source (wall-clock traces such as the Azure pair); ``"per-source"``: each
            starts at 0.
        bench: serving setup defaults (:data:`BENCH_KEYS`).
        path: where the spec came from (a file, or ``<built-in NAME>``).
        folder: folder relative paths are resolved against, or ``None`` (built-ins).
    """

    name: str
    sources: tuple[SourceSpec, ...]
    description: str = ""
    rate_scale: float = 1.0
    start_s: float = 0.0
    duration_s: float | None = None
    clock: str = "shared"
    bench: Mapping[str, Any] = field(default_factory=dict)
    path: str = ""
    folder: Path | None = None
    key_lines: Mapping[str, int] = field(default_factory=dict, repr=False)

    def line_of(self, key: str) -> int | None:
        """Line of dotted ``key`` in the spec's text (or of its nearest enclosing table)."""
        return _find_line(self.key_lines, key)


def _find_line(lines: Mapping[str, int], path: str) -> int | None:
    while path:
        if path in lines:
            return lines[path]
        cut = max(path.rfind("."), path.rfind("["))
        path = path[:cut] if cut > 0 else ""
    return None


# -- locating keys --------------------------------------------------------------------------


class _KeyLines:
    """Line of each key of a TOML text, by dotted path (``source[1].arrivals.rate_rps``)."""

    _HEADER = re.compile(r"^\s*(\[\[?)\s*([^\]]+?)\s*\]\]?\s*(#.*)?$")
    _KEY = re.compile(r"""^\s*("[^"]*"|'[^']*'|[A-Za-z0-9_-]+)\s*=""")

    def __init__(self, text: str) -> None:
        self.lines: dict[str, int] = {}
        counts: dict[str, int] = {}
        table = ""
        for number, line in enumerate(text.split("\n"), start=1):
            header = self._HEADER.match(line)
            if header:
                parts = [p.strip().strip("\"'") for p in header.group(2).split(".")]
                path = ""
                for i, part in enumerate(parts):
                    path = f"{path}.{part}" if path else part
                    last = i == len(parts) - 1
                    if header.group(1) == "[[" and last:
                        counts[path] = counts.get(path, 0) + 1
                        path = f"{path}[{counts[path] - 1}]"
                    elif path in counts:
                        path = f"{path}[{counts[path] - 1}]"
                table = path
                self.lines.setdefault(table, number)
                continue
            key = self._KEY.match(line)
            if key:
                name = key.group(1).strip("\"'")
                self.lines.setdefault(f"{table}.{name}" if table else name, number)

    def find(self, path: str) -> int | None:
        """Line of ``path``, or of its nearest enclosing table that has one."""
        return _find_line(self.lines, path)


class _Checker:
    """Typed access to a parsed TOML table, raising :class:`SpecError` with file and line."""

    def __init__(self, path: str, lines: _KeyLines) -> None:
        self.path, self.lines = path, lines

    def error(self, key: str | None, problem: str) -> SpecError:
        return SpecError(self.path, self.lines.find(key) if key else None, key, problem)

    def table(self, obj: Mapping[str, Any], key: str, allowed: set[str]) -> None:
        for name in obj:
            if name not in allowed:
                where = f"{key}.{name}" if key else name
                known = ", ".join(sorted(allowed))
                raise self.error(where, f"unknown key (known: {known})")

    def string(
        self, obj: Mapping[str, Any], key: str, path: str, choices: tuple[str, ...] | None = None
    ) -> str | None:
        if key not in obj:
            return None
        value = obj[key]
        if not isinstance(value, str) or not value:
            raise self.error(path, f"{value!r} is not a non-empty string")
        if choices is not None and value not in choices:
            raise self.error(path, f"{value!r} is not one of {', '.join(choices)}")
        return value

    def number(
        self,
        obj: Mapping[str, Any],
        key: str,
        path: str,
        *,
        minimum: float = 0.0,
        strict: bool = True,
        maximum: float = math.inf,
    ) -> float | None:
        if key not in obj:
            return None
        value = obj[key]
        if (
            isinstance(value, bool)
            or not isinstance(value, (int, float))
            or not math.isfinite(value)
        ):
            raise self.error(path, f"{value!r} is not a finite number")
        if (strict and not value > minimum) or value < minimum:
            raise self.error(path, f"{value} must be {'>' if strict else '>='} {minimum:g}")
        if value > maximum:
            raise self.error(path, f"{value:g} is over the limit of {maximum:g}")
        return float(value)

    def integer(
        self,
        obj: Mapping[str, Any],
        key: str,
        path: str,
        *,
        minimum: int = 1,
        maximum: int = MAX_TOKENS,
    ) -> int | None:
        if key not in obj:
            return None
        value = obj[key]
        if isinstance(value, bool) or not isinstance(value, int):
            raise self.error(path, f"{value!r} is not an integer")
        if value < minimum:
            raise self.error(path, f"{value} must be >= {minimum}")
        if value > maximum:
            raise self.error(path, f"{value} is over the limit of {maximum:,}")
        return value


# -- parsing --------------------------------------------------------------------------------


def _parse_slo(chk: _Checker, name: str, obj: Any, path: str) -> SLO:
    if not isinstance(obj, dict):
        raise chk.error(path, f"not a table of {', '.join(sorted(_SLO_KEYS))}")
    chk.table(obj, path, _SLO_KEYS)
    priority = obj.get("priority", 0)
    if isinstance(priority, bool) or not isinstance(priority, int):
        raise chk.error(f"{path}.priority", f"{priority!r} is not an integer")
    targets = {k: chk.number(obj, k, f"{path}.{k}") for k in sorted(_SLO_KEYS - {"priority"})}
    try:  # forms that clash (SLO.__post_init__): named by the form's key
        fields: dict[str, Any] = {**targets, "weight": targets["weight"] or 1.0}
        return SLO(name, **fields, priority=priority)
    except ValueError as exc:
        key = next((f"{path}.{k}" for k in _SLO_FORMS if k in obj and k in str(exc)), path)
        raise chk.error(key, str(exc).split(": ", 1)[-1]) from None


def _parse_arrivals(chk: _Checker, obj: Any, path: str, fmt: str) -> ArrivalSpec:
    timed = FORMATS[fmt][0]
    if obj is None:
        obj = {"process": "trace"} if timed else {}
    if isinstance(obj, str):
        obj = {"process": obj}
    if not isinstance(obj, dict):
        raise chk.error(path, 'not a table (or the string "trace")')
    chk.table(obj, path, _ARRIVAL_KEYS)
    process = chk.string(obj, "process", f"{path}.process", ("trace", "poisson", "gamma"))
    if process is None:
        raise chk.error(path, 'needs process = "trace", "poisson" or "gamma"')
    if process == "trace" and not timed:
        raise chk.error(
            f"{path}.process", f"format {fmt!r} has no arrival times; use poisson or gamma"
        )
    rate = chk.number(obj, "rate_rps", f"{path}.rate_rps", maximum=MAX_RATE_RPS)
    burstiness = chk.number(obj, "burstiness", f"{path}.burstiness")
    spread = chk.string(obj, "spread", f"{path}.spread", ("uniform", "none"))
    if process == "trace":
        for key in ("rate_rps", "burstiness"):
            if key in obj:
                raise chk.error(f"{path}.{key}", "only for poisson or gamma arrivals")
    else:
        if rate is None:
            raise chk.error(f"{path}.rate_rps", f"{process} arrivals need rate_rps")
        if spread is not None:
            raise chk.error(f"{path}.spread", "only for trace arrivals")
        if process == "poisson" and burstiness not in (None, 1.0):
            raise chk.error(f"{path}.burstiness", 'poisson has burstiness 1; use process = "gamma"')
    default_spread = "uniform" if fmt == "mooncake" else "none"
    return ArrivalSpec(process, rate, burstiness or 1.0, spread or default_spread)


def _parse_columns(chk: _Checker, obj: Any, path: str) -> ColumnMap:
    if not isinstance(obj, dict):
        raise chk.error(path, "not a table mapping arrival, prompt_tokens, output_tokens, ...")
    chk.table(obj, path, _COLUMN_KEYS)
    names = {
        k: chk.string(obj, k, f"{path}.{k}")
        for k in ("arrival", "prompt_tokens", "output_tokens", "block_hashes", "prompt")
    }
    if names["output_tokens"] is None:
        raise chk.error(f"{path}.output_tokens", "missing (the output length column)")
    if names["prompt_tokens"] is None and names["prompt"] is None:
        raise chk.error(
            f"{path}.prompt_tokens", "missing (map prompt_tokens, or prompt to tokenize)"
        )
    unit = chk.string(obj, "time_unit", f"{path}.time_unit", tuple(TIME_UNITS)) or "s"
    block = chk.integer(obj, "hash_block_tokens", f"{path}.hash_block_tokens") or 0
    if names["block_hashes"] is not None and not block:
        raise chk.error(f"{path}.hash_block_tokens", "needed with block_hashes (tokens per block)")
    return ColumnMap(
        prompt_tokens=names["prompt_tokens"],
        output_tokens=names["output_tokens"] or "",
        arrival=names["arrival"],
        time_unit=unit,
        block_hashes=names["block_hashes"],
        hash_block_tokens=block,
        prompt=names["prompt"],
    )


def _parse_source(chk: _Checker, obj: Any, index: int, slos: Mapping[str, SLO]) -> SourceSpec:
    path = f"source[{index}]"
    if not isinstance(obj, dict):
        raise chk.error(path, "not a table")
    chk.table(obj, path, _SOURCE_KEYS)
    name = chk.string(obj, "name", f"{path}.name")
    if name is None or not _NAME.match(name):
        raise chk.error(f"{path}.name", "needs a name of letters, digits, '_', '.', '-'")
    fmt = chk.string(obj, "format", f"{path}.format", tuple(FORMATS))
    if fmt is None:
        raise chk.error(f"{path}.format", f"missing (one of {', '.join(FORMATS)})")
    file = chk.string(obj, "file", f"{path}.file") or FORMATS[fmt][2]
    if file is None:
        raise chk.error(f"{path}.file", f"missing (format {fmt!r} has no default file)")
    slo_value = obj.get("slo")
    if isinstance(slo_value, str):
        if slo_value not in slos:
            known = ", ".join(sorted(slos))
            raise chk.error(f"{path}.slo", f"unknown SLO class {slo_value!r} (known: {known})")
        slo = slos[slo_value]
    elif isinstance(slo_value, dict):
        slo = _parse_slo(chk, name, slo_value, f"{path}.slo")
    else:
        raise chk.error(f"{path}.slo", "missing: a class name, or an inline table of targets")
    arrivals = _parse_arrivals(chk, obj.get("arrivals"), f"{path}.arrivals", fmt)
    columns = None
    if fmt in ("csv", "jsonl"):
        if "columns" not in obj:
            raise chk.error(f"{path}.columns", f"format {fmt!r} needs a column mapping")
        columns = _parse_columns(chk, obj["columns"], f"{path}.columns")
        if columns.arrival is None and arrivals.process == "trace":
            raise chk.error(
                f"{path}.arrivals", "no arrival column is mapped; use poisson or gamma arrivals"
            )
    elif "columns" in obj:
        raise chk.error(f"{path}.columns", "only for formats csv and jsonl")
    output = chk.integer(obj, "output_tokens", f"{path}.output_tokens")
    if fmt == "sharegpt-prompts" and output is None:
        raise chk.error(f"{path}.output_tokens", "prompt sets have no replies: set a fixed length")
    if fmt != "sharegpt-prompts" and output is not None:
        raise chk.error(f"{path}.output_tokens", "only for sharegpt-prompts (others have lengths)")
    order = chk.string(obj, "order", f"{path}.order", ("shuffle", "file")) or (
        "file" if arrivals.process == "trace" else "shuffle"
    )
    if arrivals.process == "trace" and order != "file":
        raise chk.error(f"{path}.order", "trace arrivals replay rows in file order")
    return SourceSpec(
        name=name,
        format=fmt,
        file=file,
        slo=slo,
        arrivals=arrivals,
        max_output_tokens=chk.integer(obj, "max_output_tokens", f"{path}.max_output_tokens"),
        output_tokens=output,
        rate_scale=chk.number(obj, "rate_scale", f"{path}.rate_scale", maximum=MAX_RATE_SCALE)
        or 1.0,
        num_requests=chk.integer(obj, "num_requests", f"{path}.num_requests", maximum=MAX_REQUESTS),
        order=order,
        columns=columns,
        line=chk.lines.find(path),
    )


def parse_spec(text: str, *, path: str = "<spec>", folder: Path | None = None) -> WorkloadSpec:
    """Parse and validate a spec's TOML text.

    Args:
        text: the TOML.
        path: its name in error messages.
        folder: folder that relative ``file`` paths are resolved against.

    Raises:
        SpecError: invalid TOML, an unknown key, a missing or ill-typed value, or an
            inconsistent combination (e.g. trace arrivals for a file without times).
    """
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        match = re.search(r"\(at line (\d+), column \d+\)", str(exc))
        line = int(match.group(1)) if match else None
        problem = re.sub(r"\s*\(at (line \d+, column \d+|end of document)\)", "", str(exc))
        raise SpecError(path, line, None, f"not TOML ({problem})") from None
    except (ValueError, RecursionError) as exc:
        raise SpecError(path, None, None, f"not usable TOML ({exc})") from None
    chk = _Checker(path, _KeyLines(text))
    chk.table(doc, "", _TOP_KEYS | _TOP_TABLES)
    slos: dict[str, SLO] = dict(BUILTIN_SLOS)
    slo_tables = doc.get("slo", {})
    if not isinstance(slo_tables, dict):
        raise chk.error("slo", "not a table of classes ([slo.NAME])")
    for name, obj in slo_tables.items():
        if not _NAME.match(name):
            raise chk.error(f"slo.{name}", "class names are letters, digits, '_', '.', '-'")
        slos[name] = _parse_slo(chk, name, obj, f"slo.{name}")
    raw_sources = doc.get("source")
    if not isinstance(raw_sources, list) or not raw_sources:
        raise chk.error("source", "needs at least one [[source]] table")
    sources = tuple(_parse_source(chk, obj, i, slos) for i, obj in enumerate(raw_sources))
    seen: set[str] = set()
    for i, src in enumerate(sources):
        if src.name in seen:
            raise chk.error(f"source[{i}].name", f"{src.name!r} is used by an earlier source")
        seen.add(src.name)
    bench = doc.get("bench", {})
    if not isinstance(bench, dict):
        raise chk.error("bench", "not a table")
    chk.table(bench, "bench", set(BENCH_KEYS))
    for key, kind in BENCH_KEYS.items():
        if key in bench and (isinstance(bench[key], bool) or not isinstance(bench[key], kind)):
            raise chk.error(
                f"bench.{key}",
                f"{bench[key]!r} is not a{'n' if kind is int else ''} {kind.__name__}",
            )
    for key, top in (("tp", MAX_TP), ("replicas", MAX_REPLICAS)):
        chk.integer(bench, key, f"bench.{key}", maximum=top)
    if "policies" in bench:
        names = [n.strip() for n in bench["policies"].split(",")]
        if not any(names):
            raise chk.error("bench.policies", "is empty (leave it out for the default)")
        twice = sorted({n for n in names if n and names.count(n) > 1})
        if twice:
            raise chk.error("bench.policies", f"names {twice[0]!r} twice")
    name = chk.string(doc, "name", "name") or (Path(path).stem if folder else path)
    return WorkloadSpec(
        name=name,
        sources=sources,
        description=chk.string(doc, "description", "description") or "",
        rate_scale=chk.number(doc, "rate_scale", "rate_scale", maximum=MAX_RATE_SCALE) or 1.0,
        start_s=chk.number(doc, "start_s", "start_s", strict=False, maximum=MAX_DURATION_S) or 0.0,
        duration_s=chk.number(doc, "duration_s", "duration_s", maximum=MAX_DURATION_S),
        clock=chk.string(doc, "clock", "clock", ("shared", "per-source")) or "shared",
        bench=dict(bench),
        path=path,
        folder=folder,
        key_lines=chk.lines.lines,
    )


def builtin_specs() -> dict[str, str]:
    """Built-in spec names and their TOML text (``harness/workload/workloads/*.toml``)."""
    folder = resources.files("superinfer.harness.workload").joinpath("workloads")
    return {
        entry.name.removesuffix(".toml"): entry.read_text(encoding="utf-8")
        for entry in sorted(folder.iterdir(), key=lambda e: e.name)
        if entry.name.endswith(".toml")
    }


def load_workload_spec(ref: str) -> WorkloadSpec:
    """The spec ``ref``: a path to a TOML file, or the name of a built-in spec.

    Raises:
        UserError: neither a readable file nor a built-in name.
        SpecError: the spec is invalid.
    """
    path = Path(ref).expanduser()
    if path.is_file():
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise SpecError(path, None, None, f"cannot read ({exc})") from None
        return parse_spec(text, path=str(path), folder=path.resolve().parent)
    builtins = builtin_specs()
    if ref in builtins:
        return parse_spec(builtins[ref], path=f"<built-in {ref}>")
    known = ", ".join(builtins)
    raise UserError(f"unknown workload {ref!r}; use a built-in ({known}) or a path to a TOML file")
