"""Submit a sweep to a Ray cluster as a Ray Job (`JobSubmissionClient`, the working dir shipped as runtime_env).

The spec is validated here first, so a bad spec never reaches the cluster. A relative storage
path is made absolute on this machine, so results land in one place when the cluster shares the
filesystem (or runs on this machine); point `storage` at a shared path for remote clusters.
"""

from __future__ import annotations

import json
import os
import shlex
import time
from pathlib import Path

from hdrope.errors import UserError
from sweeps.runner import prepare

__all__ = ["job_logs", "job_status", "submit_sweep"]

_EXCLUDES = [".venv", ".ci", ".git", "runs", "mlruns", "*.db", "__pycache__", ".pytest_cache", ".ruff_cache",
             ".hypothesis", "*.egg-info"]


def _client(address: str):
    """A JobSubmissionClient; uses this machine's Ray token (~/.ray/auth_token) when one exists."""
    from ray.job_submission import JobSubmissionClient

    if "RAY_AUTH_MODE" not in os.environ and (Path.home() / ".ray" / "auth_token").is_file():
        os.environ["RAY_AUTH_MODE"] = "token"
    try:
        return JobSubmissionClient(address)
    except ConnectionError as err:
        raise UserError(f"--address {address}: no Ray dashboard answers there ({str(err)[:200]}); start the cluster "
                        "(`ray start --head`) or give its dashboard address, e.g. http://HEAD:8265") from None


def submit_sweep(spec_path: str, address: str, overrides: list[str] | None = None, working_dir: str = ".") -> str:
    """Validate the spec, submit `hdrope sweep run` as a Ray Job on the cluster at address; return the job id."""
    overrides = list(overrides or [])
    plan = prepare(spec_path, overrides)
    work = Path(working_dir).resolve()
    spec = Path(spec_path).resolve()
    if not spec.is_relative_to(work):
        raise UserError(f"spec {spec_path!r} is outside --working-dir {str(work)!r}; the job only sees that folder")
    sets = [*overrides, f"storage={plan.root.parent}"]
    entry = " ".join(["python -m sweeps.console sweep run", shlex.quote(str(spec.relative_to(work))),
                      "--address auto", *(f"--set {shlex.quote(s)}" for s in sets)])
    runtime_env = {"working_dir": str(work), "excludes": _EXCLUDES}
    job_id = _submit_when_ready(_client(address), address, entrypoint=entry, runtime_env=runtime_env,
                                metadata={"sweep": plan.spec.name})
    plan.root.mkdir(parents=True, exist_ok=True)
    (plan.root / "job.json").write_text(json.dumps({"address": address, "job_id": job_id, "entrypoint": entry}))
    return job_id


# a head just started by `ray start` answers on its dashboard before its job agent is up: Ray says this, HTTP 500
_AGENT_NOT_UP = "No available agent to submit job"
AGENT_WAIT_S = 60.0


def _submit_when_ready(client, address: str, **job) -> str:
    """`client.submit_job(**job)`, tried again every 2 s for up to AGENT_WAIT_S while the head's job agent is not up."""
    deadline = time.monotonic() + AGENT_WAIT_S
    while True:
        try:
            return client.submit_job(**job)
        except RuntimeError as err:
            if _AGENT_NOT_UP not in str(err):
                raise
            if time.monotonic() > deadline:
                raise UserError(f"--address {address}: the cluster's job agent did not come up in {AGENT_WAIT_S:.0f} s "
                                "(Ray: no available agent to submit job); check the head with `ray status`, then "
                                "submit again") from None
            time.sleep(2.0)


def job_status(address: str, job_id: str) -> str:
    """PENDING, RUNNING, SUCCEEDED, FAILED or STOPPED."""
    return str(_client(address).get_job_status(job_id).value)


def job_logs(address: str, job_id: str) -> str:
    """The job driver's log."""
    return _client(address).get_job_logs(job_id)
