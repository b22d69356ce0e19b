"""sweeps: the spec schema, its plan, Ray Tune orchestration, MLflow tracking, cluster submission, resume, and the
`hdrope` console that assembles the lab's commands.

Calls `trainer.train` through its reporter hook.
"""
