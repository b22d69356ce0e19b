"""The user-error contract: `UserError` alone means exit 2; any other exception is a bug and keeps its traceback.

Pure logic: the console is called in process, and a bug is simulated by a command (or a callee) raising ValueError.
"""

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from hdrope.errors import UserError
from sweeps import console
from sweeps.spec import SpecError, load_spec


def _bug(argv: list[str]) -> int:
    raise ValueError("a bug, not a user error")


def _mistake(argv: list[str]) -> int:
    raise UserError("--flag 'x': not a size; give e.g. --flag 8")


def test_user_error_is_not_a_value_error():
    assert issubclass(UserError, Exception) and not issubclass(UserError, ValueError)
    assert issubclass(SpecError, UserError)


def test_a_value_error_from_a_command_is_not_exit_2_but_propagates(monkeypatch, capsys):
    monkeypatch.setitem(console.COMMANDS, "bug", (f"{__name__}:_bug", "raises a ValueError"))
    with pytest.raises(ValueError, match="a bug, not a user error") as err:
        console.main(["bug"])
    assert err.type is ValueError
    assert err.traceback[-1].name == "_bug"  # the traceback reaches the raising line
    assert capsys.readouterr().err == ""  # no one-line 'error:' message


def test_a_user_error_from_a_command_is_one_line_and_exit_2(monkeypatch, capsys):
    monkeypatch.setitem(console.COMMANDS, "mistake", (f"{__name__}:_mistake", "raises a UserError"))
    assert console.main(["mistake"]) == 2
    assert capsys.readouterr().err == "hdrope mistake: error: --flag 'x': not a size; give e.g. --flag 8\n"


def _spec(tmp_path: Path, overrides: str = "") -> Path:
    path = tmp_path / "s.yaml"
    path.write_text(f"name: t\nstorage: {tmp_path / 'runs'}\nbase: tiny\naxes:\n  model.pe.theta: [10000.0]\n"
                    + overrides)
    return path


def test_a_bug_while_planning_a_cell_is_not_reported_as_a_spec_problem(tmp_path, monkeypatch):
    import sweeps.plan

    def broken(layers, where="config"):
        raise ValueError("a bug in merging")

    monkeypatch.setattr(sweeps.plan, "merge_config", broken)
    with pytest.raises(ValueError, match="a bug in merging") as err:
        sweeps.plan.make_plan(load_spec(_spec(tmp_path)))
    assert err.type is ValueError  # the bug itself, not a SpecError listing it as a problem of the spec


def test_a_spec_key_set_under_a_list_is_a_spec_error_naming_it(tmp_path):
    from sweeps.plan import make_plan

    spec = load_spec(_spec(tmp_path, "overrides:\n  data.paths: [a.txt]\n  data.paths.x: 1\n"))
    with pytest.raises(SpecError, match=r"data\.paths\.x=1 cannot be set: another key of the same section makes "
                                        r"a list above it"):
        make_plan(spec)


def test_a_bug_while_loading_a_tokenizer_is_not_an_unknown_tokenizer(monkeypatch):
    import trainer.data.tokenizer
    from trainer.evals.passkey.cli import resolve_tokenizer

    def broken(kind, *args, **kwargs):
        raise ValueError("a bug in loading")

    monkeypatch.setattr(trainer.data.tokenizer, "load_tokenizer", broken)
    with pytest.raises(ValueError, match="a bug in loading") as err:
        resolve_tokenizer("bytes")
    assert err.type is ValueError  # the bug itself, not a UserError blaming --tokenizer


def test_a_dump_with_a_damaged_row_group_is_a_user_error_naming_it(tmp_path):
    from analysis.load import load_stats

    n = 64
    table = pa.table({"layer": pa.array(np.zeros(n, np.int32)), "head": pa.array(np.arange(n, dtype=np.int32)),
                      "erank": pa.array(np.linspace(1, 2, n)),
                      "attn": pa.FixedSizeListArray.from_arrays(pa.array(np.random.default_rng(0).random(n * 16)), 16)})
    path = tmp_path / "dump.parquet"
    pq.write_table(table.replace_schema_metadata({"hdrope.dump_schema": "1"}), path, compression="none")
    data = bytearray(path.read_bytes())
    data[4:600] = b"\xff" * 596  # the column chunks of row group 0; the footer stays whole
    path.write_bytes(bytes(data))
    with pytest.raises(UserError, match=r"dump\.parquet: row group 0 is unreadable \(\w+\); the file is truncated"):
        load_stats(path)


def test_every_broad_except_says_on_its_line_why():
    """An `except` that catches ValueError or Exception could hide a bug, so its line says what it expects there."""
    import ast

    repo = Path(__file__).resolve().parents[1]
    silent = []
    for pkg in ("hdrope", "trainer", "sweeps", "analysis"):
        for path in (repo / pkg).rglob("*.py"):
            lines = path.read_text().splitlines()
            for node in ast.walk(ast.parse("\n".join(lines))):
                if isinstance(node, ast.ExceptHandler) and node.type is not None:
                    names = {n.id for n in ast.walk(node.type) if isinstance(n, ast.Name)}
                    if names & {"ValueError", "Exception", "BaseException"} and "#" not in lines[node.lineno - 1]:
                        silent.append(f"{path.relative_to(repo)}:{node.lineno}")
    assert not silent


def _problems(argv: list[str]) -> int:
    raise SpecError("s.yaml", ["axes.x: not a list; write axes.x: [1, 2]", "name: empty; give a name"])


def test_an_error_listing_several_problems_is_printed_on_one_line(monkeypatch, capsys):
    monkeypatch.setitem(console.COMMANDS, "mistakes", (f"{__name__}:_problems", "raises a SpecError"))
    assert console.main(["mistakes"]) == 2
    assert capsys.readouterr().err == ("hdrope mistakes: error: s.yaml: 2 problem(s): (1) axes.x: not a list; write "
                                       "axes.x: [1, 2] (2) name: empty; give a name\n")


def test_a_nan_theta_is_one_problem_on_one_line(capsys, cache_dir, tmp_path):
    """`hdrope train tiny model.pe.theta=nan`: the NaN is named once (the encoding's own check would repeat it)."""
    code = console.main(["train", "tiny", "model.pe.theta=nan", f"data.cache_dir={cache_dir}",
                         f"train.out_dir={tmp_path}"])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and not any(tmp_path.iterdir())
    assert err == "hdrope train: error: model.pe.theta=nan: NaN and infinity are not allowed; give a finite number\n"
