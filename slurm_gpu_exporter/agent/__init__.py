"""The agent command: flags, start-up trust checks and the wiring of every layer."""
