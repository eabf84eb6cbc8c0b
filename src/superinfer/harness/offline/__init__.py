"""Offline room: analyses that replay recorded traces without an engine (cache evaluation) and
fits of simulator models (calibration)."""
