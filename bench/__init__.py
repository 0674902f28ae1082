"""Benchmarks for airgate; results are written into BENCHMARKS.md, never run as tests.

Run ``python -m bench [--quick] [--runs N] [--scenario NAME]``. Layout:

- ``__main__``: the command line; selects scenarios and writes their sections.
- ``_client``: a small async load generator for OpenAI-compatible streaming endpoints.
- ``_report``: machine/version header, statistics, tables, and the writer that rewrites one
  marked section of BENCHMARKS.md per scenario.
- one module per scenario (``edge``: the llama.cpp engine through the HTTP API against raw
  llama-cpp-python).
"""
