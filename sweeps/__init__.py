"""sweeps: the spec schema, its plan, Ray Tune orchestration, MLflow tracking, cluster submission, resume, and the
`hdrope` console that assembles the lab's commands.

Calls `trainer.train` through its reporter hook. Public names (imported on first use, so that `import sweeps` and
the console's `--help` load neither Ray nor torch):
- `load_spec`, `SweepSpec`, `SpecError`: a spec file (plus dotted overrides) validated into its schema.
- `make_plan`, `Plan`, `load_plan`: the cells a spec expands to, and a stored sweep's plan.json read back.
- `prepare`, `run_sweep`, `resume_sweep`: what `hdrope sweep plan|run|resume` call.
- `write_results`: a sweep's results.parquet from its cells' files.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from hdrope.moved import lazy_exports, register

if TYPE_CHECKING:
    from sweeps.plan import Plan, make_plan
    from sweeps.plan_file import load_plan
    from sweeps.results import write_results
    from sweeps.runner import prepare, resume_sweep, run_sweep
    from sweeps.spec import SpecError, SweepSpec, load_spec

_EXPORTS = {
    "load_spec": "sweeps.spec",
    "SweepSpec": "sweeps.spec",
    "SpecError": "sweeps.spec",
    "make_plan": "sweeps.plan",
    "Plan": "sweeps.plan",
    "load_plan": "sweeps.plan_file",
    "prepare": "sweeps.runner",
    "run_sweep": "sweeps.runner",
    "resume_sweep": "sweeps.runner",
    "write_results": "sweeps.results",
}

__all__ = ["Plan", "SpecError", "SweepSpec", "load_plan", "load_spec", "make_plan", "prepare", "resume_sweep",
           "run_sweep", "write_results"]

register({"sweeps.tracking": "trainer.run.tracking"})  # tracking is the trainer's: it logs one run's metrics


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals())
