"""Engine wiring: from configuration to running engines.  The one place that picks concrete
engines and key providers.

    runtime        settings -> deployments -> served models; start and stop the engines
    registry       model ids and aliases -> deployments -> engines
    breaker        each deployment's circuit breaker (its health, as the router sees it)
    sources        where weights come from: signed bundles (and the embedded default)
    key_providers  KMS providers from configuration, built on first use
"""

__all__: list[str] = []
