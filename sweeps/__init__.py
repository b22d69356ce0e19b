"""sweeps: spec schema, Ray Tune orchestration, MLflow tracking, cluster submission, resume.

Not built yet (issue 4). Calls `trainer.train` through its reporter hook.
"""
