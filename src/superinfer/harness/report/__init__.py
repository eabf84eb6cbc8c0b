"""Report room: per-request metrics, result files (CSV, parquet, manifest), ``report.md`` and plots.

Reads the frames the engines produced; imports no engine runner.
"""
