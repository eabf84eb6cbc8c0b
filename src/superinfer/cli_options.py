"""Option helpers shared by the ``superinfer`` commands (``cli.py`` and each ``cli_<command>.py``
module that registers a command of its own)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import click

ROUTERS = ["round_robin", "least_tokens", "slo_aware", "cache_aware"]  # sim.routers.ROUTERS


def split_names(value: str | None) -> tuple[str, ...]:
    """``"a, b,,c"`` -> ``("a", "b", "c")``; ``None`` or ``""`` -> ``()``."""
    return tuple(v.strip() for v in value.split(",") if v.strip()) if value else ()


def key_values(pairs: tuple[str, ...], flag: str) -> dict[str, str]:
    """``("k=v", ...)`` -> ``{"k": "v"}``; raises ``click.BadParameter`` naming ``flag`` on a pair
    without ``=`` or with an empty key."""
    out = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise click.BadParameter(f"expected KEY=VALUE, got {pair!r}", param_hint=flag)
        out[key.strip()] = value.strip()
    return out


def options(*decorators: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """Apply ``decorators`` (click options) in the order listed, as ``--help`` shows them."""

    def apply(fn: Any) -> Any:
        for option in reversed(decorators):
            fn = option(fn)
        return fn

    return apply


# -- shared option groups ---------------------------------------------------------------------


def engine_option(help: str) -> Callable[[Any], Any]:
    """``--engine-option KEY=VALUE`` (repeatable), with the command's own help text."""
    return click.option("--engine-option", "engine_options", multiple=True, metavar="KEY=VALUE",
                        help=help)  # fmt: skip


def seed_option(help: str = "Seed of every random choice.") -> Callable[[Any], Any]:
    """``--seed N`` (default 0; numpy's generators take seeds >= 0 only, so a negative one is a
    usage error here, not a traceback in the middle of a run)."""
    return click.option(
        "--seed", default=0, show_default=True, type=click.IntRange(min=0), help=help
    )


def cluster_options(gpu: str, helps: tuple[str, str, str]) -> Callable[[Any], Any]:
    """--model, --gpu, --tp (bench and fleet plan: ``--gpu`` default and help texts differ)."""
    model_help, gpu_help, tp_help = helps
    return options(
        click.option("--model", default="llama-3.1-70b", show_default=True, help=model_help),
        click.option("--gpu", default=gpu, show_default=True, help=gpu_help),
        click.option("--tp", default=4, show_default=True, type=int, help=tp_help),
    )


ROUTER_OPTION = click.option(
    "--router", default="round_robin", show_default=True, type=click.Choice(ROUTERS),
    help="How arrivals are spread over replicas.",
)  # fmt: skip

#: --executor, --address, --workers, --fresh (sweep and fleet plan).
EXECUTOR_OPTIONS = options(
    click.option("--executor", default="local", show_default=True,
                 type=click.Choice(["local", "ray"]),
                 help="Run cells in local processes, or as Ray tasks (needs the `ray` extra)."),
    click.option("--address", default=None,
                 help="Ray cluster address (`auto`, `ray://host:10001`) [default: a local Ray "
                 "instance on 127.0.0.1]."),
    click.option("--workers", default=None, type=int,
                 help="Local processes, or CPUs of the local Ray instance [default: all CPUs]."),
    click.option("--fresh", is_flag=True, help="Ignore cached cells (they are still rewritten)."),
)  # fmt: skip
