"""HTTP: the server, its TLS/auth config and reloading, connection limits, log throttling.
Imports only the exposition layer of the agent."""
