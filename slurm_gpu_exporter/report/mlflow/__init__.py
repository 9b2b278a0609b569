"""Ended jobs' figures into the MLflow runs that name them (``slurm-gpu-report mlflow``):
MLflow's REST API, which runs to fill, and the figures as MLflow metrics and tags."""
