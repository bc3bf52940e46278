"""The benchmarks' reporting runs without a GPU: a rerun on another machine must not die after its timings."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


def load(name: str):
    """A benchmark script as a module (benchmarks/ is not a package)."""
    pytest.importorskip("triton")  # imported here, not at collection: test_sparton sets TRITON_INTERPRET first
    spec = importlib.util.spec_from_file_location(f"bench_{name}_under_test", BENCHMARKS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_bench_head_reports_rows_without_gpu_samples(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    bench = load("bench_head")
    samples = [(10.0, 1500.0, 690.0, 0x4), (10.05, 1520.0, 700.0, 0x0), (11.0, 1980.0, 300.0, 0x0)]
    assert bench.window_state(samples, 9.9, 10.1) == {"sm_mhz": 1510.0, "watts": 695.0, "power_capped": 0.5}
    empty = bench.window_state(samples, 10.2, 10.9)  # a timing shorter than the gap between two samples
    assert empty == {"sm_mhz": None, "watts": None, "power_capped": None}
    rows = []
    for variant, ms, batch in (("kernel", 2.6, 128), ("eager", 12.0, 128), ("kernel_packed", 2.8, 548)):
        tokens = 32768
        rows.append({"vocab": 30522, "batch": batch, "seq": 256, "dtype": "bfloat16", "variant": variant,
                     "tokens": tokens, "floor_ms": 2.2, "status": "ok", "ms": ms, "peak_bytes": 2**24,
                     "x_floor": ms / 2.2, "extra_bytes_beyond_output": 2**20, **empty})
    for row in rows:
        print(bench._fmt(row))  # a row without GPU samples prints (no KeyError on 'sm_mhz')
    meta = {"matmul_bf16_tflops": 690.0, "matmul_state": empty}
    bench.write_results("NVIDIA Test GPU", meta, rows, {}, tmp_path)
    bench.summary(rows, {})
    written = json.loads((tmp_path / "head_Test.json").read_text())
    assert written["rows"][0]["sm_mhz"] is None and written["meta"]["matmul_state"]["watts"] is None
    assert (tmp_path / "head_Test.png").read_bytes().startswith(b"\x89PNG")
    out = capsys.readouterr().out
    assert "kernel     2.600 ms" in out and "MHz" not in out
    assert f"{12.0 / 2.6:.2f}" in out.splitlines()[-1]  # the summary's eager / kernel ratio


def test_sample_encode_samples_a_cli_run_from_its_first_import(tmp_path, capsys, monkeypatch):
    """The stack sampler shows where an encode's fixed costs go; it must keep running here (CPU, a few documents)."""
    sampler = load("sample_encode")
    corpus = tmp_path / "c.jsonl"
    corpus.write_text("".join(json.dumps({"id": str(i), "text": f"protein {i} binds"}) + "\n" for i in range(20)))
    monkeypatch.setattr(sys, "argv", ["sample_encode.py", "--window", "0.1", "--top", "5",
                                      "--threads", "MainThread,model-load", "--cli",
                                      f"-q encode {corpus} -o {tmp_path / 'v'} --device cpu --doc-max-length 16"])
    sampler.main()
    out = capsys.readouterr().out
    assert "encoded 20 documents" in out and "from before the first import" in out
    assert "samples per thread" in out and "thread MainThread, most frequent stack per 0.1 s" in out
    assert "load_model" in out.split("thread model-load, most frequent stack per 0.1 s")[1]  # its timeline
    assert (tmp_path / "v" / "manifest.json").exists()


def test_gpu_busy_places_idle_gaps_on_the_host():
    """gpu_busy.py's report from a hand-made trace (µs): busy time, gap classes, and a late launch placed on the op
    the launching thread was in (nested ops counted once, through the outermost), the rest on Python between ops."""
    busy = load("gpu_busy")

    def kernel(ms, dur, name, corr):
        return {"ph": "X", "cat": "kernel", "ts": ms * 1000, "dur": dur * 1000, "name": name,
                "args": {"correlation": corr}}

    def host(ms, dur, name, cat="cpu_op", corr=None):
        return {"ph": "X", "cat": cat, "ts": ms * 1000, "dur": dur * 1000, "name": name, "tid": 7,
                **({"args": {"correlation": corr}} if corr is not None else {})}

    trace = {"traceEvents": [
        kernel(0, 10, "spin_kernel", 1), kernel(100, 400, "sm90_gemm", 2), kernel(500.005, 99.995, "splade_max", 3),
        kernel(5_600, 400, "elementwise_kernel", 4), kernel(7_000, 10, "spin_kernel", 5),
        host(50, 10, "cudaLaunchKernel", "cuda_runtime", 2), host(480, 20, "cudaLaunchKernel", "cuda_runtime", 3),
        host(5_500, 10, "cudaLaunchKernel", "cuda_runtime", 4),
        host(600, 3_000, "aten::item"), host(700, 100, "aten::copy_"),
    ]}
    row = busy.summarize(trace, wall=8.0, result={"docs": 80})
    assert row["kernels"] == 3 and row["gpu_busy_s"] == 0.9 and row["first_kernel_after_s"] == 0.09
    assert row["idle_after_last_kernel_s"] == 1.0 and row["kernel_span_s"] == 5.9
    assert row["idle_gaps"]["<10us"]["count"] == 1 and row["idle_gaps"][">=100000us"]["count"] == 1
    assert row["kernel_seconds_by_kind"] == {"gemm": 0.4, "elementwise": 0.4, "sparton head": 0.1}
    host_side = row["gaps_from_1ms_and_the_first"]
    # the 5 s gap: launched 4.9 s late, 3 s inside aten::item, 1.9 s in Python; before the first kernel 40 ms more
    assert host_side["late_by_host_op_s"] == {"aten::item": 3.0, "(no torch op: Python)": 1.94}
    assert host_side["late_launch_s"] == 4.94 and host_side["queued_s"] == 0.0
    assert [g["idle_ms"] for g in host_side["largest"]] == [5000.0, 90.0]
