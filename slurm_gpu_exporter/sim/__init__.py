"""A synthetic node for --simulate: jobs through the real hooks, a simulated GPU backend."""
