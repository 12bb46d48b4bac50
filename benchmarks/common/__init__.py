"""Shared parts of the benchmark scripts: flags, workloads, HTTP clients, metrics, environment, result files."""
