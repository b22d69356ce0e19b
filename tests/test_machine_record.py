"""run.json, results.parquet and the report name the machine a number came from (issue 33 §10): CPU model, torch's
CPU capability, GPU, torch version and threads; cells of one comparison on different machines are warned about."""

from __future__ import annotations

import json
import textwrap

import pyarrow.parquet as pq
import torch

from analysis.load import sweep_cells
from analysis.machines import machine_lines
from trainer.config import config_hash
from trainer.files.machine import MACHINE_COLUMNS, cpu_model, machine_info, machine_label, machine_row
from trainer.files.run_files import RUN_FILE, claim_run_dir, read_machines
from trainer.run.loop import train

EPYC = {"cpu_model": "AMD EPYC", "cpu_capability": "AVX2", "gpu": None, "torch_version": "2.13.0+cpu", "threads": 1}
ZEN4 = {**EPYC, "cpu_capability": "AVX512"}


def test_a_run_records_its_machine_in_run_json_and_keeps_its_config_hash(tiny_cfg, tmp_path):
    cfg = tiny_cfg("train.steps=2", "train.log_every=1", "train.eval_every=2", "train.threads=1",
                   "eval.passkey.enabled=false", "eval.extrapolation=[2]", "dump.enabled=false")
    before = config_hash(cfg)
    train(cfg)
    run = json.loads((tmp_path / "run" / RUN_FILE).read_text())
    assert run["config_hash"] == before == config_hash(cfg)
    m = run["machine"]
    assert m["cpu_capability"] == torch.backends.cpu.get_cpu_capability() and m["cpu_model"] == cpu_model()
    assert m["torch_version"] == torch.__version__ and m["threads"] == 1 and m["gpu"] is None
    assert run["machines"] == [m] and set(m) == set(MACHINE_COLUMNS)


def test_cpu_model_reads_cpuinfo(tmp_path):
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nvendor_id\t: AuthenticAMD\nmodel name\t: AMD EPYC 9R14 96-Core Processor\n")
    assert cpu_model(info) == "AMD EPYC 9R14 96-Core Processor"
    assert cpu_model(tmp_path / "absent")  # falls back to platform's answer, never empty


def test_a_resume_on_another_machine_keeps_both(tmp_path):
    claim_run_dir(tmp_path, "abc", "r", EPYC)
    claim_run_dir(tmp_path, "abc", "r", EPYC)  # a resume on the same machine adds nothing
    claim_run_dir(tmp_path, "abc", "r", ZEN4)
    assert read_machines(tmp_path) == [EPYC, ZEN4]
    row = machine_row(read_machines(tmp_path))
    assert row["cpu_capability"] == "AVX2 + AVX512" and row["cpu_model"] == "AMD EPYC" and row["threads"] == 1
    assert machine_row([]) == dict.fromkeys(MACHINE_COLUMNS)
    assert machine_label(EPYC) == "AMD EPYC (CPU AVX2), torch 2.13.0+cpu, 1 thread"
    assert machine_label(machine_info()).endswith(f"torch {torch.__version__}, {torch.get_num_threads()} threads"
                                                  if torch.get_num_threads() != 1 else "1 thread")


def _finished_sweep(tmp_path, stored_sweep, machines: dict[str, dict]):
    """A RoPE vs 4D sweep whose cells ran on the given machine per kind."""
    spec = tmp_path / "m.yaml"
    spec.write_text(textwrap.dedent(f"""
        name: machines
        base: tiny
        storage: {tmp_path / 'store'}
        axes:
          model.pe.kind: [rope, hdrope]
          seed: [1, 2]
    """))
    return stored_sweep(spec, lambda c: {"val_loss": 2.0 + 0.1 * c.config.train.seed},
                        lambda c: machines[c.values["model.pe.kind"]])


def test_results_carry_the_machine_per_cell_and_the_report_names_it(tmp_path, stored_sweep):
    root = _finished_sweep(tmp_path, stored_sweep, {"rope": EPYC, "hdrope": EPYC})
    table = pq.read_table(root / "results.parquet").to_pylist()
    assert [r["cpu_capability"] for r in table] == ["AVX2"] * 4 and {r["threads"] for r in table} == {1}
    lines = machine_lines(sweep_cells(root))
    assert lines[0].startswith("Machines: 4 cells on AMD EPYC (CPU AVX2), torch 2.13.0+cpu, 1 thread.")
    assert not [x for x in lines if "Warning" in x]


def test_the_report_warns_when_a_comparison_mixes_cpu_capabilities(tmp_path, stored_sweep):
    root = _finished_sweep(tmp_path, stored_sweep, {"rope": EPYC, "hdrope": ZEN4})
    lines = machine_lines(sweep_cells(root))
    assert "2 cells on AMD EPYC (CPU AVX2)" in lines[0] and "2 cells on AMD EPYC (CPU AVX512)" in lines[0]
    warning = [x for x in lines if x.startswith("**Warning**")]
    assert len(warning) == 1 and "4D Paley vs RoPE" in warning[0] and "float kernels differ" in warning[0]
    from analysis.report import build_report

    report = build_report(root).read_text()
    assert warning[0] in report and lines[0] in report
    assert "threads" not in (root / "report" / "comparisons.csv").read_text()  # a machine column is no metric
