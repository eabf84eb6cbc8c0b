"""``superinfer calibrate``: fit a step-time model: the simulated GPUs' to measured kernel
timings, the real CPU engine's (hf) or an SGLang server's step log, or the engines' own costs
to published measurements (results/calibration, results/fidelity)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import click

from superinfer.cli_options import engine_option, key_values, seed_option
from superinfer.harness.errors import UserError

# -- calibrate --------------------------------------------------------------------------------


# fmt: off
@click.command()
@click.option("--engine", default="gpu", show_default=True,
              help="gpu, hf, sglang or published. gpu: fit the simulated GPU engines' step-time "
              "model to the measured kernel timings in shared/data/profiling; hf: measure the real "
              "CPU engine, fit sim:hf-cpu; sglang: fit sim:sglang-cpu to a real SGLang server's "
              "step log (--steps).")
@engine_option("hf: engine setting, repeatable (as for bench).")
@seed_option("hf: seed of the prompt order.")
@click.option("--steps", "steps_file", default=None, type=click.Path(dir_okay=False),
              help="hf: refit from steps recorded earlier (a *_steps.csv of calibrate, or a run's "
              "steps.parquet) instead of measuring; sglang: the server's step log (required).")
@click.option("--out", default=None, type=click.Path(),
              help="gpu: directory for fit_error.csv, fit_error_by_range.csv, params.json, "
              "report.md [results/calibration]; hf, sglang: calibration file, its steps go "
              "beside it [hf: results/hf/step_time_fit.json; sglang: sglang_step_time.json].")
@click.option("--install/--no-install", default=True, show_default=True,
              help="gpu: also write the parameters into the package (sim/calibration.json), where "
              "the simulator reads them.")
# fmt: on
def calibrate(engine: str, engine_options: tuple[str, ...], seed: int, steps_file: str | None,
              out: str | None, install: bool) -> None:  # fmt: skip
    """Fit a step-time model: the simulated GPUs' (default), the real CPU engine's (hf), or the
    engines' own costs against published measurements (published)."""
    targets: dict[str, Callable[[], None]] = {
        "hf": lambda: _calibrate_hf(engine_options, seed, steps_file, out),
        "sglang": lambda: _calibrate_hf(
            engine_options, seed, steps_file, out or "sglang_step_time.json", server_log=True
        ),
        "gpu": lambda: _calibrate_gpu(out, install, steps_file),
        "published": lambda: _calibrate_published(out, install, steps_file),
    }
    if engine not in targets:
        raise UserError(
            f"calibrate fits the simulated GPUs (--engine gpu), measures the real CPU engine "
            f"(--engine hf), refits an SGLang step log (--engine sglang) or the published "
            f"measurements (--engine published), not {engine!r}"
        )
    targets[engine]()  # each checks its --out (and --steps) before it measures or fits


def _calibrate_hf(engine_options: tuple[str, ...], seed: int, steps_file: str | None,
                  out: str | None, server_log: bool = False) -> None:  # fmt: skip
    """Measure real engine steps (or refit recorded ones) and fit the sim:hf-cpu step time; with
    ``server_log``, fit sim:sglang-cpu's to an SGLang server's step log."""
    from superinfer.harness.offline.calibrate_hf import fit_summary, write_hf_calibration
    from superinfer.harness.report.results import check_out_file

    out = str(check_out_file(Path(out or "results/hf/step_time_fit.json")))
    model, report, path, steps_path = write_hf_calibration(
        key_values(engine_options, "--engine-option"), seed=seed, steps_file=steps_file,
        out=out, server_log=server_log,
    )  # fmt: skip
    click.echo("\n".join([*fit_summary(model, report), f"wrote {path} and {steps_path}"]))


def _no_steps(steps_file: str | None, engine: str) -> None:
    if steps_file is not None:  # was ignored (a long run, then not the fit asked for)
        raise UserError(f"--steps applies to calibrate --engine hf or sglang, not {engine}")


def _calibrate_gpu(out: str | None, install: bool, steps_file: str | None) -> None:
    """Fit the simulator's step-time model to the measured GPU timings in shared/data/profiling."""
    from superinfer.harness.offline.calibrate import write_gpu_calibration
    from superinfer.harness.report.results import check_out_dir

    _no_steps(steps_file, "gpu")
    out_dir = check_out_dir(Path(out or "results/calibration"))
    out_dir, *installed = write_gpu_calibration(str(out_dir), install=install)
    files = "fit_error.csv, fit_error_by_range.csv, params.json, report.md"
    click.echo("\n".join([f"wrote {out_dir}/ ({files})", *(f"wrote {t}" for t in installed)]))


def _calibrate_published(out: str | None, install: bool, steps_file: str | None) -> None:
    """Simulate every published setup and fit the engines' costs to the published numbers."""
    from superinfer.harness.offline.calibrate_published import write_published
    from superinfer.harness.report.results import check_out_dir

    _no_steps(steps_file, "published")
    out_dir = check_out_dir(Path(out or "results/fidelity"))
    written = write_published(out_dir, install=install, progress=click.echo)
    click.echo("\n".join(f"wrote {p}" for p in written))
