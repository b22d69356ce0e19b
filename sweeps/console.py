"""The `hdrope` console script, where the lab is assembled: a lazy dispatcher to the commands each package owns.

Commands are named by "module:function" strings and imported only when run, so `hdrope bases` imports no
torch model code and `hdrope report` no Ray; the `hdrope` library itself knows none of its users. A command
function takes argv (list[str]) and returns an exit code. A `hdrope.errors.UserError` escaping a command is a
user error: one line, exit code 2. Any other exception is a bug and keeps its traceback.
"""

from __future__ import annotations

import importlib
import os
import sys
from typing import NoReturn

from hdrope.errors import UserError, one_line

__all__ = ["BENCHES", "COMMANDS", "EXIT_INTERRUPTED", "EXIT_UNWRITTEN", "PLAN_CHECKS", "PLAN_WARNINGS", "cli",
           "flush_streams", "main", "plan_findings", "run_command"]

# name -> (target, one-line help). Each package registers its own entries here by string only.
COMMANDS: dict[str, tuple[str, str]] = {
    "bases": ("hdrope.commands:bases_main", "table of mixing bases: orthogonality, det, incoherence, K density"),
    "train": ("trainer.run.cli:train_main", "train one model from a preset or YAML plus key=value overrides"),
    "data": ("trainer.data.cli:data_main", "prepare a corpus as verified, resumable token shards for training"),
    "passkey": ("trainer.evals.passkey.cli:passkey_main", "build the paper's passkey dataset / evaluate a checkpoint"),
    "eval": ("trainer.evals.cli:eval_main", "downstream benchmarks of a checkpoint through lm-evaluation-harness"),
    "export": ("trainer.export.cli:export_main", "a checkpoint as a standard HF LlamaForCausalLM with the same logits"),
    "sweep": ("sweeps.cli:sweep_main", "plan|run|submit|status|logs|resume|results of Ray Tune sweeps"),
    "ui": ("sweeps.cli:ui_main", "MLflow UI on 127.0.0.1 for a sweep's tracking store"),
    "report": ("analysis.cli:report_main", "the paper's tables and figures from a sweep (Markdown + PNG, to MLflow)"),
    "seeds": ("analysis.cli:seeds_main", "seeds a planned sweep needs to detect a difference, from a pilot's spread"),
    "theory": ("analysis.cli:theory_main", "decay bound, B(Δ), wavelengths and K mixing per rotation dim and θ"),
    "bench": ("sweeps.console:bench_main", "benchmarks: rotary, encodings, train, tasks, sweep, analysis, length"),
}
BENCHES: dict[str, tuple[str, str]] = {
    "rotary": ("hdrope.bench:main", "HD-RoPE kernels vs RoPE and the elementwise floor"),
    "encodings": ("trainer.model.bench:main", "the q/k transform of every position-encoding kind vs RoPE"),
    "train": ("trainer.run.bench:main", "training step time of RoPE vs HD-RoPE, tokens/s vs HF Llama, MFU"),
    "tasks": ("trainer.evals.tasks_bench:main", "training step with task_ratio 0.5 vs a language-model step; "
              "task-evaluation cost"),
    "sweep": ("sweeps.bench:main", "an 8-cell tiny grid under Ray Tune vs back to back in one process"),
    "analysis": ("analysis.bench:main", "effective-rank throughput (maps/s) at L = 256 and 1024 over a stored dump"),
    "length": ("trainer.model.bench_length:main", "every kind's training step at 512..8192 tokens: peak memory and "
               "step time vs RoPE, memory slope"),
}


# what a plan checks in another package, by string (spec key -> "module:function" taking the Plan, returning problems)
PLAN_CHECKS: dict[str, str] = {
    "questions": "analysis.questions:plan_problems",  # declared questions name planned variants and metrics
}


# what a plan warns of from another package, by string (spec key -> "module:function" taking the Plan, returning lines)
PLAN_WARNINGS: dict[str, str] = {
    "questions": "analysis.questions:plan_warnings",  # a declared family its seeds can never mark
}


def _load(target: str):
    module, func = target.split(":")
    return getattr(importlib.import_module(module), func)


def _usage(table: dict[str, tuple[str, str]], prog: str) -> str:
    width = max(map(len, table))
    rows = "\n".join(f"  {name:<{width}}  {help_}" for name, (_, help_) in table.items())
    return f"usage: {prog} <command> [args]\n\ncommands:\n{rows}\n"


def _dispatch(table: dict[str, tuple[str, str]], argv: list[str], prog: str) -> int:
    if not argv or argv[0] in ("-h", "--help"):
        sys.stdout.write(_usage(table, prog))
        return 0 if argv else 2
    name, rest = argv[0], argv[1:]
    if name not in table:
        sys.stderr.write(f"{prog}: unknown command {name!r}; choose one of {', '.join(table)}\n")
        return 2
    try:
        return int(_load(table[name][0])(rest) or 0)
    except UserError as err:
        sys.stderr.write(f"{prog} {name}: error: {one_line(err)}\n")
        return 2


def run_command(name: str, argv: list[str]) -> int:
    """Run the command `name` of COMMANDS with argv, imported by its string: how one package's command hands over
    to another's (`hdrope sweep plan --detect` to the analysis's `hdrope seeds`) without importing it."""
    return int(_load(COMMANDS[name][0])(argv) or 0)


def plan_findings(plan) -> tuple[list[str], list[str]]:
    """The problems PLAN_CHECKS find in a plan and, when there are none, the warnings PLAN_WARNINGS give, for each
    spec key that is set (each imported only then)."""
    problems = [p for key, target in PLAN_CHECKS.items() if getattr(plan.spec, key, None) for p in _load(target)(plan)]
    if problems:
        return problems, []
    return [], [w for key, target in PLAN_WARNINGS.items() if getattr(plan.spec, key, None)
                for w in _load(target)(plan)]


def bench_main(argv: list[str]) -> int:
    """`hdrope bench <target>`: run one package's benchmark."""
    return _dispatch(BENCHES, argv, "hdrope bench")


EXIT_INTERRUPTED = 130  # 128 + SIGINT, as a shell reports a command Ctrl-C stopped
EXIT_UNWRITTEN = 120  # what Python exits with when it cannot flush its output at exit


class _Unwritable(Exception):
    """The command's output could not be written to stdout (a full disk, an I/O error)."""


class _Output:
    """stdout as the command sees it: a failure to write it (other than a reader that went away) becomes
    `_Unwritable`, so the console reports it in one line instead of a command's traceback."""

    def __init__(self, stream) -> None:
        self._stream = stream

    def write(self, text: str) -> int:
        try:
            return self._stream.write(text)
        except BrokenPipeError:
            raise
        except OSError as err:
            raise _Unwritable(err) from None

    def flush(self) -> None:
        try:
            self._stream.flush()
        except BrokenPipeError:
            raise
        except OSError as err:
            raise _Unwritable(err) from None

    def __getattr__(self, name: str):
        return getattr(self._stream, name)


def main(argv: list[str] | None = None) -> int:
    """Entry point of the `hdrope` console script."""
    for name in ("stdout", "stderr"):  # a stream the caller closed (`hdrope bases >&-`): its output is discarded
        if getattr(sys, name) is None:
            setattr(sys, name, open(os.devnull, "w"))  # the process's own stream, open until it exits
    stdout = sys.stdout
    sys.stdout = _Output(stdout)
    try:
        return _dispatch(COMMANDS, list(sys.argv[1:] if argv is None else argv), "hdrope")
    except BrokenPipeError:  # the reader went away (`hdrope bases | head`): stop quietly
        os.dup2(os.open(os.devnull, os.O_WRONLY), stdout.fileno())
        return 0
    except _Unwritable as err:
        sys.stderr.write(f"hdrope: could not write the output: {err.args[0]}\n")
        os.dup2(os.open(os.devnull, os.O_WRONLY), stdout.fileno())  # what is still buffered goes nowhere
        return EXIT_UNWRITTEN
    except KeyboardInterrupt:  # Ctrl-C: one line, the shell's exit code, no traceback
        sys.stderr.write("hdrope: interrupted\n")
        return EXIT_INTERRUPTED
    finally:
        if isinstance(sys.stdout, _Output):
            sys.stdout = stdout


def _exit_without_teardown(code: int) -> NoReturn:
    """End the process with `code` as Python would, less the teardown of its modules: threads are joined, exit
    handlers run (Ray's shutdown, MLflow's flush, multiprocessing's joins, logging's), the standard streams are
    flushed, then the process exits. Tearing down torch, MLflow and Ray's modules takes 1-2.5 s of CPU after a
    command that loaded them (docs/house.md); nothing the lab writes waits on it."""
    import atexit
    import threading

    for thread in threading.enumerate():
        if thread is not threading.main_thread() and not thread.daemon:
            thread.join()
    atexit._run_exitfuncs()
    os._exit(flush_streams(code))


def flush_streams(code: int) -> int:
    """Flush stdout and stderr; the exit code: `code`, or EXIT_UNWRITTEN with one line on stderr when stdout's
    output could not be written (`hdrope bases > /dev/full`). A reader that went away (a broken pipe) or a closed
    stream loses nothing it asked for."""
    try:
        sys.stdout.flush()
    except BrokenPipeError:
        pass
    except OSError as err:  # ENOSPC, EIO: the output is lost, and the exit code says so
        try:
            sys.stderr.write(f"hdrope: could not write the output: {err}\n")
        except OSError:
            pass
        code = code or EXIT_UNWRITTEN
    except ValueError:  # a stream closed by the command itself
        pass
    try:
        sys.stderr.flush()
    except (OSError, ValueError):  # stderr closed too
        pass
    return code


def cli() -> int:
    """The `hdrope` console script (and `python -m sweeps.console`): main(), then exit without module teardown.
    A command that raises (a bug's traceback, a signal's exit code) ends the usual way, and so does a run under a
    profiler (`python -m cProfile -m sweeps.console ...` writes its figures after the command returns)."""
    code = main()
    if sys.getprofile() is None:
        _exit_without_teardown(code)
    return code


if __name__ == "__main__":
    sys.exit(cli())
