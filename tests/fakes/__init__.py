"""Test-only doubles of engines that cannot be installed on CPU-only machines."""
