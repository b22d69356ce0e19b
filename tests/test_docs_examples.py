"""The docs cannot rot: every ```python block in README.md and docs/*.md runs, and the README stays a front door.

Each block runs alone in a process of its own (the repository on its path, the session's data cache in HDROPE_CACHE,
one torch thread), in an empty temporary directory, under a time limit, so a block can neither lean on another nor
leave files in the repository. The process is forked from one interpreter that imported torch and numpy once (it
runs nothing else), which saves each block about 3 s of imports; a block runs as `python block.py` would run it.
A block states what it shows with `assert` lines; a failing block fails its test with the page, the line and the
block's output. Blocks in ```bash, ```text, ```yaml, … are not run.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
README_MAX_LINES = 250
BLOCK_TIMEOUT_S = 120

_FENCE = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>```+|~~~+)[ \t]*(?P<info>[^\n`]*)$")


def _closes(line: str, fence: str) -> bool:
    stripped = line.strip()
    return stripped.startswith(fence) and not stripped.strip(fence[0])


def python_blocks(text: str) -> list[tuple[int, str]]:
    """The ```python blocks of a markdown text: (line of the opening fence, code), the code dedented by the
    fence's indent (a block inside a list item runs as written)."""
    blocks: list[tuple[int, str]] = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        m = _FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        indent, fence, info = m["indent"], m["fence"], m["info"].strip()
        body: list[str] = []
        j = i + 1
        while j < len(lines) and not _closes(lines[j], fence):
            body.append(lines[j][len(indent):] if lines[j].startswith(indent) else lines[j].lstrip())
            j += 1
        language = info.split()[0].lower() if info else ""
        if language in ("python", "py"):
            blocks.append((i + 1, "\n".join(body) + "\n"))
        i = j + 1
    return blocks


def _cases() -> list:
    cases = []
    for page in PAGES:
        for line, code in python_blocks(page.read_text(encoding="utf-8")):
            rel = page.relative_to(ROOT).as_posix()
            cases.append(pytest.param(rel, line, code, id=f"{rel}:{line}"))
    return cases


# The block runner: a fresh interpreter that imports torch and numpy, then forks one child per request (a JSON line:
# script, out, err) that runs the script as __main__ in the script's directory, its output in the named files, and
# answers the child's exit code (-1: killed at the time limit).
_FORKER = r"""
import atexit, json, os, runpy, signal, sys, time, traceback
import numpy, torch  # what nearly every block imports: paid once here, before any fork
for request in sys.stdin:
    job = json.loads(request)
    child = os.fork()
    if child == 0:  # whatever happens here, the child ends here: it never reads the next request
        code = 1
        try:
            os.setsid()
            folder = os.path.dirname(job["script"])
            os.chdir(folder)
            os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
            for fd, name in ((1, job["out"]), (2, job["err"])):
                os.dup2(os.open(name, os.O_WRONLY | os.O_CREAT | os.O_TRUNC), fd)
            sys.argv, sys.path[0] = [job["script"]], folder
            runpy.run_path(job["script"], run_name="__main__")
            code = 0
        except SystemExit as stop:
            code = stop.code if isinstance(stop.code, int) else int(stop.code is not None)
        except BaseException:
            traceback.print_exc()
        finally:
            atexit._run_exitfuncs()  # what the block registered (a Ray it started stops here)
            sys.stdout.flush(); sys.stderr.flush()
            os._exit(code)
    deadline = time.monotonic() + job["timeout"]
    while (done := os.waitpid(child, os.WNOHANG))[0] == 0 and time.monotonic() < deadline:
        time.sleep(0.02)
    if done[0] == 0:
        os.killpg(child, signal.SIGKILL)
        os.waitpid(child, 0)
        status = -1
    else:
        status = os.waitstatus_to_exitcode(done[1])
    print(json.dumps(status), flush=True)
"""


@pytest.fixture(scope="module")
def run_block(cache_dir: str):
    """run(script) -> (exit code, stdout, stderr) of `python script` in the script's folder, through the forker."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
           "HDROPE_CACHE": cache_dir, "OMP_NUM_THREADS": "1", "MPLBACKEND": "Agg"}  # one thread: CI's cores are few
    forker = subprocess.Popen([sys.executable, "-c", _FORKER], env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              text=True, cwd=ROOT)

    def run(script: Path) -> tuple[int, str, str]:
        out, err = script.with_suffix(".out"), script.with_suffix(".err")
        forker.stdin.write(json.dumps({"script": str(script), "out": str(out), "err": str(err),
                                       "timeout": BLOCK_TIMEOUT_S}) + "\n")
        forker.stdin.flush()
        answer = forker.stdout.readline()
        assert answer, "the block runner died"
        return json.loads(answer), out.read_text(), err.read_text()

    yield run
    forker.stdin.close()
    forker.wait(30)


@pytest.mark.parametrize(("page", "line", "code"), _cases())
def test_docs_python_block_runs(page: str, line: int, code: str, run_block, tmp_path: Path) -> None:
    script = tmp_path / "block.py"
    script.write_text(code)  # a traceback's line N is the page's line `line` + N
    code_, out, err = run_block(script)
    if code_ == -1:
        pytest.fail(f"{page}:{line}: the block ran past {BLOCK_TIMEOUT_S} s (docs examples must take seconds)")
    assert code_ == 0, f"{page}:{line} failed (exit {code_}):\n{out}\n{err}"


def test_the_block_runner_reports_failures_exits_and_the_time_limit(run_block, tmp_path: Path, monkeypatch) -> None:
    """What the runner answers is what `python block.py` would: the exit code, the output, a traceback, and a block
    stopped at the time limit; and a block runs in its own folder, with the repository importable."""
    cases = {"ok": ("import os, hdrope; print(os.getcwd())", 0), "fails": ("assert 1 == 2, 'nope'", 1),
             "exits": ("import sys; sys.exit(3)", 3), "writes": ("open('made.txt', 'w').write('x')", 0)}
    for name, (code, want) in cases.items():
        folder = tmp_path / name
        folder.mkdir()
        (folder / "block.py").write_text(code + "\n")
        got, out, err = run_block(folder / "block.py")
        assert got == want, (name, out, err)
        if name == "ok":
            assert out.strip() == str(folder)
        if name == "fails":
            assert "AssertionError: nope" in err and 'block.py", line 1' in err
    assert (tmp_path / "writes" / "made.txt").read_text() == "x"
    monkeypatch.setattr(sys.modules[__name__], "BLOCK_TIMEOUT_S", 1)
    (tmp_path / "slow.py").write_text("import time; time.sleep(30)\n")
    assert run_block(tmp_path / "slow.py")[0] == -1


def test_docs_have_python_examples() -> None:
    """The extractor finds blocks (a regex that matched nothing would pass every page silently)."""
    assert len(_cases()) >= 5
    text = "intro\n\n```python\nx = 1\n```\n\n- item\n\n  ```python\n  assert x\n  ```\n\n```bash\nls\n```\n"
    assert python_blocks(text) == [(3, "x = 1\n"), (9, "assert x\n")]


def test_readme_is_a_front_door() -> None:
    """README.md stays at most 250 lines; the rest lives in docs/."""
    n = len((ROOT / "README.md").read_text(encoding="utf-8").splitlines())
    assert n <= README_MAX_LINES, f"README.md has {n} lines (at most {README_MAX_LINES}): move detail into docs/"


def test_readme_links_reach_files() -> None:
    """README.md lives outside the docs site, so mkdocs does not check its links: every relative link names a file
    that exists."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    targets = [t.split("#")[0] for t in re.findall(r"\]\(([^)\s]+)\)", text) if "://" not in t]
    assert targets
    missing = [t for t in targets if t and not (ROOT / t).exists()]
    assert not missing, f"README.md links to missing files: {missing}"


def test_docs_site_builds_strict(tmp_path: Path) -> None:
    """`mkdocs build --strict` (what .ci/run runs): a broken link, anchor, nav entry or API reference fails."""
    pytest.importorskip("mkdocs")
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    run = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=BLOCK_TIMEOUT_S)
    assert run.returncode == 0, run.stdout + run.stderr
    assert (tmp_path / "site" / "api" / "hdrope" / "index.html").exists()
