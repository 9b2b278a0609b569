"""The job archive: one summary row per ended job past Prometheus' retention, in SQLite or
PostgreSQL. The only package that imports SQLAlchemy."""
