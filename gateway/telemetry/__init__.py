"""Telemetry, content-free by construction.

metrics       Prometheus: vLLM's names plus `airgate_*`
loop_metrics  lock-free counters and histograms for the event loop's thread
traces        OpenTelemetry spans (GenAI conventions): the inference span, the provider
export        the allow-list every span passes on its way out, the OTLP/HTTP exporter
logs          one JSON object per line on stderr (text_logs: short lines on a terminal)
"""

__all__: list[str] = []
