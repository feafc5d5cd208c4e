"""The report (jinja2 templates), its tables and figures, and the MLflow tracking of a pipeline run."""
