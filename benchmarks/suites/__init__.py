"""Prompt suites shipped with the benchmarks (package data: *.jsonl; see README.md here)."""
