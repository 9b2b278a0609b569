"""The agent's jobs: which jobs run here (tracker.py), their GPU allocation and their CPU
and memory figures (stats.py)."""
