"""The docs cannot rot: every ```python block in README.md and docs/*.md runs, and the README stays a front door.

Each block runs alone in a fresh interpreter (the repository on PYTHONPATH, the session's data cache in
HDROPE_CACHE), in an empty temporary directory, under a time limit, so a block can neither lean on another nor
leave files in the repository. A block states what it shows with `assert` lines; a failing block fails its test
with the page, the line and the block's output. Blocks in ```bash, ```text, ```yaml, … are not run.
"""

from __future__ import annotations

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


@pytest.mark.parametrize(("page", "line", "code"), _cases())
def test_docs_python_block_runs(page: str, line: int, code: str, cache_dir: str, tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
           "HDROPE_CACHE": cache_dir, "OMP_NUM_THREADS": "1", "MPLBACKEND": "Agg"}  # one thread: CI's cores are few
    script = tmp_path / "block.py"
    script.write_text(code)  # a traceback's line N is the page's line `line` + N
    try:
        run = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True, text=True,
                             timeout=BLOCK_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        pytest.fail(f"{page}:{line}: the block ran past {BLOCK_TIMEOUT_S} s (docs examples must take seconds)")
    assert run.returncode == 0, f"{page}:{line} failed (exit {run.returncode}):\n{run.stdout}\n{run.stderr}"


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
