"""The one Prometheus client (``client``: HTTP API, auth, TLS) and the PromQL the reports
ask (``queries``), with what the answers mean as job figures."""
