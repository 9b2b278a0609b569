"""An HTTP Basic ``Authorization`` value, as the servers the reports talk to read it."""

from __future__ import annotations

import base64


def basic_authorization(user: str, password: str) -> str:
    """``Basic base64(user:password)`` in UTF-8 (RFC 7617): what Go's servers
    (Prometheus, VictoriaMetrics) and MLflow's (werkzeug) decode."""
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode("ascii")
