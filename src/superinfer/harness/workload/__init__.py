"""Workload room: data lookup, trace readers, arrival processes, TOML specs, prompts.

The first stage of a run's data path: what requests arrive, when, with which SLO. Imports
nothing of the harness but ``harness.errors``.
"""
