"""The harness: workloads, runners, metrics, results and reports. Only the CLI imports it."""
