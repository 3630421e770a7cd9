"""One finished record -> Prometheus metrics, OpenTelemetry spans and metrics, the log line."""
