"""Every simulated engine, by engine id: which exist, and how to build a simulation of each.

Two families, told apart by :attr:`SimEngine.family` (never by comparing engine ids):

* :data:`ROOFLINE` (``sim:vllm``, ``sim:sglang``, ``sim:trtllm``, the profiles of
  ``sim.profiles.PROFILES``): any model and GPU of ``sim.hardware``, any TP degree, replica count
  and router; step time from the calibrated roofline (``sim.calibrated.default_step_time``). Build
  with :func:`roofline_sim_config`.
* :data:`HF_CPU` (``sim:hf-cpu``, ``sim.hf_cpu.SIM_HF_CPU``): the real CPU engine ``hf`` as the
  simulator models it: its own model (SmolLM2-135M) and host, one replica, a KV pool set by its
  engine options, and a step time fitted on that engine (``sim.hf_cpu.HFCPUStepTime``). Build with
  ``sim.hf_cpu.hf_cpu_sim_config``.

``PROFILES`` keeps the roofline profiles only: ``sim:hf-cpu``'s model and hardware are fixed, so
it cannot run where a run names a model and a GPU (sweep cells, fleet plans).
"""

from __future__ import annotations

from dataclasses import dataclass

from superinfer.sim.config import SimConfig
from superinfer.sim.hardware import get_gpu, get_model
from superinfer.sim.hf_cpu import SIM_HF_CPU
from superinfer.sim.profiles import PROFILES, EngineProfile

__all__ = [
    "FAMILIES",
    "HF_CPU",
    "ROOFLINE",
    "SIM_ENGINES",
    "SimEngine",
    "get_sim_engine",
    "roofline_sim_config",
]

#: Family of the GPU engines: any model, GPU and cluster size; roofline step time.
ROOFLINE = "roofline"
#: Family of the real CPU engine's model: fixed model and host; fitted step time.
HF_CPU = "hf-cpu"
#: Every family, in the order :data:`SIM_ENGINES` lists them.
FAMILIES = (ROOFLINE, HF_CPU)


@dataclass(frozen=True, slots=True)
class SimEngine:
    """One simulated engine.

    Attributes:
        engine_id: its id, e.g. ``"sim:vllm"`` (the profile's name).
        profile: its mechanics.
        family: :data:`ROOFLINE` or :data:`HF_CPU`: which builder makes its ``SimConfig`` and
            which step-time model it runs with (module docstring).
    """

    engine_id: str
    profile: EngineProfile
    family: str

    @property
    def native_policy(self) -> str:
        """The registered name of the engine's own scheduling policy."""
        return self.profile.native_policy

    @property
    def fixed_hardware(self) -> bool:
        """Whether the engine's model and host are fixed (a run's model, GPU, TP and replica
        count do not apply)."""
        return self.family == HF_CPU


#: Every simulated engine by id: the roofline profiles, then ``sim:hf-cpu``.
SIM_ENGINES: dict[str, SimEngine] = {
    **{name: SimEngine(name, profile, ROOFLINE) for name, profile in PROFILES.items()},
    SIM_HF_CPU.name: SimEngine(SIM_HF_CPU.name, SIM_HF_CPU, HF_CPU),
}


def get_sim_engine(engine_id: str) -> SimEngine:
    """Look up a simulated engine by id.

    Raises:
        KeyError: unknown id; the message lists the known ones.
    """
    if engine_id not in SIM_ENGINES:
        known = ", ".join(sorted(SIM_ENGINES))
        raise KeyError(f"unknown engine {engine_id!r}; known: {known}")
    return SIM_ENGINES[engine_id]


def roofline_sim_config(
    engine_id: str,
    *,
    model: str,
    gpu: str,
    tp: int = 1,
    replicas: int = 1,
    router: str = "round_robin",
    cpu_kv_ratio: float | None = None,
    horizon_s: float | None = None,
) -> SimConfig:
    """The simulation of a :data:`ROOFLINE` engine serving ``model`` on ``gpu``.

    Args:
        engine_id: a roofline engine id (``sim.profiles.PROFILES``).
        model: model name (``sim.hardware.get_model``).
        gpu: GPU name or alias (``sim.hardware.get_gpu``).
        tp: tensor-parallel degree.
        replicas: replicas behind the router.
        router: one of ``sim.routers.ROUTERS``.
        cpu_kv_ratio: CPU-tier capacity over HBM KV capacity; ``None`` takes the profile's.
        horizon_s: stop simulating at this instant; ``None`` runs until every request ends.

    Raises:
        KeyError: unknown engine, model or GPU, or an engine of another family; the message
            says which.
    """
    engine = get_sim_engine(engine_id)
    if engine.family != ROOFLINE:
        raise KeyError(f"engine {engine_id!r} has a fixed model and host: not a roofline engine")
    return SimConfig(
        engine.profile,
        get_model(model),
        get_gpu(gpu),
        tp=tp,
        replicas=replicas,
        router=router,
        cpu_kv_ratio=cpu_kv_ratio,
        horizon_s=horizon_s,
    )
