"""Benchmarks for airgate; results are written into BENCHMARKS.md.

Run ``python -m bench [--quick] [--runs N] [--scenario NAME]``, or ``--check`` to build every
scenario's set-up without starting anything. The tests never measure: they run ``bundles
--quick`` and each server scenario's ``--check`` (``tests/unit/test_bench_smoke.py``).
Layout:

- ``__main__``: the command line; selects scenarios and writes their sections.
- shared: ``_client`` (an async load generator for OpenAI-compatible streaming endpoints),
  ``_report`` (machine/version header, statistics, tables, the writer that rewrites one marked
  section of BENCHMARKS.md per scenario), ``_serve`` (servers under test as subprocesses, their
  settings and app keys), ``_levels`` (a streaming server loaded level by level), ``_runs``
  (repeated runs, discarded when other processes disturbed them), ``_wrk`` (wrk, CPU pinning),
  ``_check`` (what ``--check`` validates).
- one module per scenario, with its parts beside it: ``edge`` (the llama.cpp engine against
  llama-server, llama_cpp.server and raw llama-cpp-python: ``edge_workload``, ``edge_raw``,
  ``edge_servers``, ``edge_report``), ``vllm_peer`` (airgate against ``vllm serve``:
  ``vllm_workload``, ``vllm_servers``, ``vllm_report``), ``http_path`` (the HTTP path against a
  bare route and LiteLLM: ``http_servers``, ``http_report``, ``bare_app``), ``access`` (audit
  throughput, ``audit_throughput``, and access-control latency), ``bundles``, ``structured``
  (constrained decoding against unconstrained on both engines, grammar compile times, and
  against llama-server at concurrency 8: ``structured_schemas``, ``structured_engines``,
  ``structured_servers``, ``structured_report``).
- the soak, ``python -m bench.soak`` (not a scenario): ``soak``, ``soak_requests``,
  ``soak_probes``, ``soak_report``.
- peers and models: ``peers_llama``, ``peers_llama_server``, ``peers_litellm``, ``llama_model``.
"""
