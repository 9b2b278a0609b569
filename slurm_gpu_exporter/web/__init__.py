"""HTTP every server stands on (the agent, remediate, the proxy): listening, the
connection guard, auth middleware, TLS/auth config and reloading, stopping on signals,
logging set-up; and the agent's exposition routes (server.py, the one module here that
imports another layer: exposition)."""
