"""The job model every layer shares: one frozen description of a job and its GPU
allocation. Pure and standard library only: the hooks, the node readers, the jobs layer
and the exposition all import it."""
