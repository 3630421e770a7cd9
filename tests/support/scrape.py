"""Prometheus scrape configurations for a sidecar outside Kubernetes: the two jobs the chart's
PodMonitor makes, with the labels service discovery would add given as static labels."""

from __future__ import annotations


def pod_scrape_config(admin_address: str, labels: dict[str, str]) -> dict:
    """``llm-sidecar`` (the sidecar's own /metrics) and ``llm-engine`` (/metrics/engine, the
    engine's page passed through) on the admin port, scraped every second."""
    target = {"targets": [admin_address], "labels": labels}
    return {
        "global": {"scrape_interval": "1s", "scrape_timeout": "1s"},
        "scrape_configs": [
            {"job_name": "llm-sidecar", "static_configs": [target]},
            {
                "job_name": "llm-engine",
                "metrics_path": "/metrics/engine",
                "static_configs": [target],
            },
        ],
    }
