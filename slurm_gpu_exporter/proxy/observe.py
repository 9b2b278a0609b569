"""The proxy's own metrics, on its ``/metrics``. No label holds a user name: the user
is in the refusal's log line, not in a series everybody can read."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest


class ProxyMetrics:
    """Requests by endpoint and status, refusals by reason, upstream latency."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.requests = Counter(
            "slurm_gpu_proxy_requests", "Requests answered, by endpoint and HTTP status.",
            ["endpoint", "code"], registry=self.registry)
        self.refusals = Counter(
            "slurm_gpu_proxy_refusals", "Requests refused, by reason.", ["reason"],
            registry=self.registry)
        self.upstream_seconds = Histogram(
            "slurm_gpu_proxy_upstream_duration_seconds",
            "Time the upstream Prometheus took to answer, by endpoint.", ["endpoint"],
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10,
                     30, 60), registry=self.registry)
        self.upstream_errors = Counter(
            "slurm_gpu_proxy_upstream_errors", "Upstream requests that got no answer "
            "(refused connection, timeout) or one past the size limit.", ["endpoint"],
            registry=self.registry)

        self.connections_refused = Counter(
            "slurm_gpu_proxy_connections_refused", "Connections closed at once because "
            "the proxy had its maximum open, every one in a request.", registry=self.registry)

    def exposition(self) -> bytes:
        return generate_latest(self.registry)
