"""The benchmark harness (``gem bench`` / ``python -m bench``) on the CPU at tiny sizes.

Ceilings are measured on small buffers here (`small_ceilings`) to keep the suite fast; the harness's
arithmetic is checked against the ceilings each record carries. Triton runs in its interpreter
(tests/conftest.py sets TRITON_INTERPRET=1 without a GPU).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
import types
from collections.abc import Iterable
from pathlib import Path

import pytest
from helpers import ROOT, needs_extra

from gemkernels.benchmark import machine as bench_machine
from gemkernels.benchmark import point as bench_point
from gemkernels.benchmark import report as bench_report
from gemkernels.benchmark import sweep as benchmark
from gemkernels.benchmark.point import Point, Settings

RECORD_KEYS = {"kind", "status", "note", "config", "timing", "checks", "metrics", "ceilings", "env"}
CONFIG_KEYS = {"mode", "dtype", "sessions", "n", "d", "b", "tau", "k", "backend", "library_backend", "path",
               "device", "copies", "repeats_max", "warmup", "point_seconds", "seed", "timer"}
METRIC_KEYS = {"sessions_per_s", "blocks_per_s", "work_flop", "x_bytes", "gflop_per_s", "gb_per_s",
               "bandwidth_fraction", "flops_fraction", "read_x_once_s", "b_passes_s", "roofline_s",
               "roofline_fraction", "time_over_read_once", "time_over_b_passes", "speedup_vs_torch"}
ENV_KEYS = {"date", "git_commit", "git_dirty", "cpu", "cpu_count", "python", "gemkernels", "numpy", "torch",
            "triton", "gpu"}
FAST = ["--device", "cpu", "--repeats", "5", "--point-seconds", "0.01", "-b", "4"]


@pytest.fixture(autouse=True)
def small_ceilings(monkeypatch):
    """A 4 MiB copy and a 128^3 GEMM: enough to exercise the measurement, quick to run."""
    monkeypatch.setitem(bench_machine.CEILING_SIZES, "cpu", (4 << 20, 128, 3))


def run_bench(out: Path, *args: str) -> tuple[int, list[dict]]:
    code = benchmark.main([*FAST, "--out", str(out), *args])
    return code, [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]


def points(records: Iterable[dict], status: str | None = None) -> list[dict]:
    return [r for r in records if r["kind"] == "point" and (status is None or r["status"] == status)]


@pytest.fixture(scope="module")
def subgrid(tmp_path_factory) -> tuple[Path, int, list[dict]]:
    """One small sweep shared by the tests that read its records: 2 n x 1 d x 1 S x 2 modes x 2 backends,
    rotating through 2 input copies."""
    pytest.importorskip("torch")
    pytest.importorskip("matplotlib")
    out = tmp_path_factory.mktemp("bench")
    with pytest.MonkeyPatch.context() as mp:
        mp.setitem(bench_machine.CEILING_SIZES, "cpu", (4 << 20, 128, 3))
        code, records = run_bench(out, "-n", "8", "24", "-d", "32", "-S", "3", "--dtype", "fp32",
                                  "--mode", "fixed", "tau", "--backend", "numpy", "torch", "--copies", "2")
    return out, code, records


def test_subgrid_option_measures_exactly_the_requested_points(subgrid):
    _, code, records = subgrid
    assert code == 0
    got = {(r["config"]["mode"], r["config"]["n"], r["config"]["backend"]) for r in points(records, "ok")}
    assert got == {(m, n, b) for m in ("fixed", "tau") for n in (8, 24) for b in ("numpy", "torch")}
    assert len(points(records)) == 8
    assert all(r["config"]["d"] == 32 and r["config"]["sessions"] == 3 and r["config"]["copies"] == 2
               for r in points(records))


def test_records_have_every_field(subgrid):
    _, _, records = subgrid
    for rec in points(records, "ok"):
        assert set(rec) == RECORD_KEYS
        assert set(rec["config"]) == CONFIG_KEYS
        assert set(rec["metrics"]) == METRIC_KEYS
        assert ENV_KEYS <= set(rec["env"])
        assert set(rec["timing"]) == {"median_s", "q1_s", "q3_s", "repeats"}
        assert rec["timing"]["repeats"] >= 5
        assert rec["ceilings"]["copy_bytes_per_s"] > 0 and rec["ceilings"]["matmul_flop_per_s"]["fp32"] > 0
        assert all(v is not None for k, v in rec["metrics"].items())


def test_steps_follow_the_mode(subgrid):
    _, _, records = subgrid
    for rec in points(records, "ok"):
        c, checks = rec["config"], rec["checks"]
        if c["mode"] == "fixed":
            assert checks["steps_min"] == checks["steps_max"] == min(c["b"], c["n"], c["d"])
        else:
            assert 1 <= checks["steps_min"] <= checks["steps_max"] <= c["b"]
        if c["backend"] == "numpy":
            assert checks["same_indices_as_torch"] == 1.0


def test_ratios_come_from_the_measured_ceilings(subgrid):
    _, _, records = subgrid
    torch_median = {(r["config"]["mode"], r["config"]["n"]): r["timing"]["median_s"]
                    for r in points(records, "ok") if r["config"]["backend"] == "torch"}
    for rec in points(records, "ok"):
        c, m, t = rec["config"], rec["metrics"], rec["timing"]["median_s"]
        bandwidth, peak = rec["ceilings"]["copy_bytes_per_s"], rec["ceilings"]["matmul_flop_per_s"][c["dtype"]]
        x_bytes = c["sessions"] * c["n"] * c["d"] * 4
        flops = 2 * c["n"] * c["d"] * rec["checks"]["steps_total"]
        assert m["x_bytes"] == x_bytes and m["work_flop"] == flops
        assert m["gflop_per_s"] == pytest.approx(flops / t / 1e9)
        assert m["gb_per_s"] == pytest.approx(x_bytes / t / 1e9)
        assert m["sessions_per_s"] == pytest.approx(c["sessions"] / t)
        assert m["blocks_per_s"] == pytest.approx(c["sessions"] * c["n"] / t)
        assert m["bandwidth_fraction"] == pytest.approx(x_bytes / t / bandwidth)
        assert m["flops_fraction"] == pytest.approx(flops / t / peak)
        assert m["read_x_once_s"] == pytest.approx(x_bytes / bandwidth)
        assert m["time_over_b_passes"] == pytest.approx(
            t / (x_bytes / bandwidth * rec["checks"]["steps_total"] / c["sessions"]))
        assert m["roofline_fraction"] == pytest.approx(max(x_bytes / bandwidth, flops / peak) / t)
        assert m["speedup_vs_torch"] == pytest.approx(torch_median[(c["mode"], c["n"])] / t)


def test_report_and_plots_are_written(subgrid):
    out, _, _ = subgrid
    for name in ("results.md", "throughput.png", "roofline.png"):
        assert (out / name).stat().st_size > 0
    for name in ("throughput.png", "roofline.png"):
        assert (out / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    text = (out / "results.md").read_text()
    assert "| cpu | fixed | fp32 | 3 | 24 | 32 | numpy |" in text
    assert "not measured in these results" in text  # the GPU targets, on a CPU run
    (out / "results.md").unlink()
    assert benchmark.main(["--out", str(out), "--report-only", "--no-plots"]) == 0
    assert (out / "results.md").read_text() == text


def test_targets_report_the_fastest_triton_path():
    def rec(backend: str, median: float, over_read: float, speedup: float) -> dict:
        config = {"device": "cuda", "mode": "fixed", "dtype": "bf16", "sessions": 4096, "n": 256, "d": 1024, "b": 16,
                  "backend": backend}
        return {"kind": "point", "status": "ok", "config": config, "timing": {"median_s": median},
                "metrics": {"time_over_read_once": over_read, "speedup_vs_torch": speedup}}

    lines = bench_report.target_lines([rec("torch", 0.1, 90.0, 1.0), rec("triton-gram", 0.002, 1.8, 50.0),
                                       rec("triton-fused", 0.004, 3.6, 25.0)])
    assert lines[0].endswith("bf16: **1.8x** (triton-gram, 2 ms; target <= 2x)")
    assert lines[1].endswith("bf16: **50x** (triton-gram, 2 ms; target >= 10x)")
    assert lines[2].endswith("not measured in these results (target <= 1.5x)")


def test_impossible_size_is_skipped_with_a_note(tmp_path):
    code, records = run_bench(tmp_path, "-n", "4096", "-d", "4096", "-S", "100000000", "--dtype", "fp32",
                              "--mode", "fixed", "--backend", "numpy")
    assert code == 0
    (rec,) = points(records)
    assert rec["status"] == "skipped" and "does not fit in memory" in rec["note"]
    assert rec["timing"] is None and rec["metrics"] is None
    assert "does not fit in memory" in (tmp_path / "results.md").read_text()


def test_left_out_combinations_become_notes(tmp_path, monkeypatch):
    pytest.importorskip("torch")
    pytest.importorskip("triton")
    code, records = run_bench(tmp_path, "-n", "8", "-d", "16", "-S", "1", "--dtype", "bf16", "--mode", "fixed",
                              "--backend", "numpy", "--time-budget", "100")
    assert code == 0 and not points(records)
    assert any("numpy has no bfloat16" in r["note"] for r in records if r["kind"] == "note")
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert "interpreter would be timed" in benchmark.left_out(["triton-fused", "torch"], "cuda")["triton-fused"]
    monkeypatch.delenv("TRITON_INTERPRET")
    assert set(benchmark.left_out(["triton-gram", "numpy"], "cpu")) == {"triton-gram"}


def test_time_budget_stops_before_the_next_point(tmp_path):
    code, records = run_bench(tmp_path, "-n", "8", "16", "-d", "16", "-S", "1", "--dtype", "fp32",
                              "--mode", "fixed", "--backend", "numpy", "--time-budget", "0")
    assert code == 0 and not points(records)
    assert any("time budget" in r["note"] for r in records)
    assert not (tmp_path / "throughput.png").exists()


def test_a_point_starts_only_when_the_one_before_would_still_fit(tmp_path, monkeypatch):
    """The budget counts from the sweep's start, the ceilings' measurement included, and a point starts only if
    the previous point's time still fits (it was checked against the time spent alone, so a point begun a moment
    before the end ran past it: a GPU stage's limit then killed it half-way)."""
    import gemkernels.benchmark.sweep as sweep_module

    real_point, real_ceilings = sweep_module.measure_point, sweep_module.measure_ceilings

    def slow_point(*args, **kwargs):
        time.sleep(0.6)
        return real_point(*args, **kwargs)

    def slow_ceilings(*args, **kwargs):
        time.sleep(0.6)
        return real_ceilings(*args, **kwargs)

    monkeypatch.setattr(sweep_module, "measure_point", slow_point)
    monkeypatch.setattr(sweep_module, "measure_ceilings", slow_ceilings)
    code, records = run_bench(tmp_path, "-n", "8", "16", "24", "-d", "16", "-S", "1", "--dtype", "fp32",
                              "--mode", "fixed", "--backend", "numpy", "--time-budget", "1.5")
    assert code == 0 and [r["config"]["n"] for r in points(records)] == [8]  # 0.6 + 0.6 spent, 0.6 more won't fit
    assert any("2 of 3 points not run" in r["note"] for r in records if r["kind"] == "note")


def test_triton_paths_in_the_interpreter(tmp_path):
    pytest.importorskip("torch")
    pytest.importorskip("triton")
    if benchmark.left_out(["triton-gram"], "cpu"):
        pytest.skip("triton cannot run here: " + benchmark.left_out(["triton-gram"], "cpu")["triton-gram"])
    triton = ["triton-gram", "triton-fused", "triton-stepwise", "triton-gram-global", "triton-fused-global"]
    code, records = run_bench(tmp_path, "-n", "16", "-d", "32", "-S", "2", "--dtype", "fp32", "--mode", "fixed",
                              "--backend", "torch", *triton, "--repeats", "3", "--no-plots")
    assert code == 0
    ok = {r["config"]["backend"]: r for r in points(records, "ok")}
    assert set(ok) == {"torch", *triton}
    for name in triton:
        assert ok[name]["config"]["path"] == name.removeprefix("triton-")
        assert ok[name]["checks"]["same_indices_as_torch"] == 1.0
        assert ok[name]["metrics"]["speedup_vs_torch"] > 0
    from gemkernels.select.backends import triton_backend

    assert triton_backend.current_options() == triton_backend.TritonOptions()  # the forced options were put back


def test_forced_triton_options_by_contender_name():
    pytest.importorskip("torch")
    from gemkernels.select.backends import triton_backend

    for path, expected in ((None, triton_backend.TritonOptions()),
                           ("fused", triton_backend.TritonOptions(path="fused")),
                           ("gram-global", triton_backend.TritonOptions(path="gram", resident=False))):
        with bench_point.triton_path(path):
            assert triton_backend.current_options() == expected
        assert triton_backend.current_options() == triton_backend.TritonOptions()


def test_gram_tile_candidates_in_the_interpreter(tmp_path):
    """bench.select_floor's Gram section at a tiny shape: every candidate timed, checked and set against the
    floors it measured."""
    pytest.importorskip("torch")
    pytest.importorskip("triton")
    if benchmark.left_out(["triton-gram"], "cpu"):
        pytest.skip("triton cannot run here: " + benchmark.left_out(["triton-gram"], "cpu")["triton-gram"])
    if not (ROOT / "bench" / "select_floor.py").is_file():
        pytest.skip("bench/ comes with a checkout of the repository, not with the package or its sdist")
    sys.path.insert(0, str(ROOT))
    from bench import cases, select_floor

    rec = select_floor.Recorder(tmp_path)
    case = cases.Case("tiny", sessions=3, n=20, d=24, tau=1.0, k=4)
    tiles = ((16, 8, 4, 3), (16, 16, 4, 1), (32, 8, 4, 3))
    select_floor.gram_tiles(rec, case, "cpu", repeats=3, tiles=tiles, dtypes=("float32",))
    rows = [json.loads(line) for line in (tmp_path / "results.jsonl").read_text().splitlines()]
    floor, grams, selects = rows[0], rows[1::2], rows[2::2]
    assert len(rows) == 1 + 2 * len(tiles) and floor["measurement"].startswith("floor")
    config = floor["config"]
    assert floor["median_s"] == pytest.approx(max(
        (3 * 20 * 24 * 4 + 4 * 3 * 20 ** 2) / config["copy_bandwidth_b_per_s"],
        3 * 20 * 21 * 24 / config["matmul_flop_per_s"]))
    for (block_m, block_k, warps, stages), gram, select in zip(tiles, grams, selects):
        assert gram["measurement"] == f"gram {block_m}x{block_k} w{warps} s{stages}"
        assert gram["tiles"] == 3 * {16: 3, 32: 1}[block_m]  # 20 rows: 2 row tiles of 16 (3 upper), 1 of 32
        assert gram["computed_flops"] == 2 * gram["tiles"] * block_m ** 2 * 24
        assert gram["ratios"]["gram/floor"] == pytest.approx(gram["median_s"] / floor["median_s"])
        assert gram["gram_max_abs_diff_vs_first"] < 1e-5 and gram["same_indices_as_first"] == 1.0
        assert select["ratios"]["select/read-once"] == pytest.approx(select["median_s"] / floor["read_once_s"])


def test_inputs_are_one_seeded_draw_in_every_dtype():
    """numpy on "cpu"; the torch-generator branch (the one CUDA takes) on any other torch device."""
    torch = pytest.importorskip("torch")
    x32 = bench_point.make_values(6, 5, "float32", "cpu", seed=3)
    assert x32.dtype.name == "float32" and x32.shape == (6, 5)
    assert bench_point.make_values(6, 5, "float16", "cpu", seed=3).dtype.name == "float16"
    bf16 = bench_point.make_values(6, 5, "bfloat16", "cpu", seed=3)
    assert bf16.dtype == torch.bfloat16 and torch.allclose(bf16.float(), torch.from_numpy(x32), rtol=1e-2)
    t32, t16 = (bench_point.make_values(6, 5, dt, "cpu:0", seed=3) for dt in ("float32", "bfloat16"))
    assert isinstance(t32, torch.Tensor) and t16.dtype == torch.bfloat16
    assert torch.allclose(t16.float(), t32, rtol=1e-2)
    batch = bench_point.make_batch(t32, 3)
    assert batch.num_sessions == 2 and not batch.protected.any() and batch.eligible.all()


def test_gem_subcommand_hook(tmp_path):
    """What the ``gem`` parser wires: ``gem bench`` parses into the sweep's options and runs it through ``func``."""
    needs_extra("bench")
    from gemkernels.cli import build_parser

    args = build_parser().parse_args(["bench", *FAST, "-n", "8", "-d", "16", "-S", "1", "--dtype", "fp32",
                                      "--mode", "fixed", "--backend", "numpy", "--no-plots", "--out", str(tmp_path)])
    assert args.command == "bench" and args.func(args) == 0
    assert len(points(json.loads(line) for line in (tmp_path / "results.jsonl").read_text().splitlines())) == 1
    with pytest.raises(SystemExit, match="warmup >= 2"):
        benchmark.main([*FAST, "--warmup", "1", "--out", str(tmp_path)])


def test_grid_axes_and_order():
    args = argparse.Namespace(quick=False, n=None, d=[384], sessions=None, dtype=None, mode=None, backend=None)
    cuda, cpu = benchmark.grid_axes(args, "cuda"), benchmark.grid_axes(args, "cpu")
    assert cuda["sessions"] == (1, 64, 1024, 8192) and cpu["sessions"] == (1, 64, 1024)
    assert cpu["d"] == (384,) and cpu["n"] == (16, 64, 256, 1024, 4096)
    assert cpu["backend"] == ("numpy", "numba", "torch", "triton-gram", "triton-fused", "triton-stepwise")
    assert Point("fixed", "fp32", sessions=1, n=64, d=8, b=16).steps == 8  # rank min(n, d) caps the steps
    grid = benchmark.grid_points(cuda, b=16)
    assert len(grid) == 2 * 3 * 4 * 5 * 1
    sizes = [p.x_bytes for p in grid]
    assert sizes == sorted(sizes)
    quick = benchmark.grid_axes(argparse.Namespace(**{**vars(args), "quick": True, "d": None}), "cpu")
    assert quick == benchmark.QUICK_GRID["cpu"]


def test_copies_rotate_past_l2_and_shrink_to_fit(monkeypatch):
    point = Point("fixed", "bf16", sessions=4, n=64, d=128, b=16)  # 64 KiB of X
    settings = Settings(device="cpu", repeats=5)
    monkeypatch.setattr(bench_point, "l2_bytes", lambda device: 1 << 20)
    assert bench_point.plan_copies(point, ["torch"], settings) == (32, None)  # 4 MiB / 64 KiB = 64, capped
    monkeypatch.setattr(bench_point, "l2_bytes", lambda device: 100 << 10)
    assert bench_point.plan_copies(point, ["torch"], settings) == (7, None)  # ceil(400 KiB / 64 KiB)
    need_one = bench_point.memory_need(point, ["torch"], 1, "cpu")["cpu"]
    monkeypatch.setattr(bench_point, "free_bytes", lambda where: math.ceil((need_one + 3 * point.x_bytes) / 0.9) + 1)
    assert bench_point.plan_copies(point, ["torch"], settings) == (4, None)
    monkeypatch.setattr(bench_point, "free_bytes", lambda where: need_one // 2)
    copies, why = bench_point.plan_copies(point, ["torch"], settings)
    assert copies == 0 and "does not fit" in why
    with pytest.raises(ValueError):
        Settings(device="cpu", repeats=5, warmup=1)


def test_nvml_info_reads_a_device_and_reports_failures(monkeypatch):
    class NVMLError(Exception):
        pass

    calls = []
    fake = types.SimpleNamespace(
        NVMLError=NVMLError, NVML_CLOCK_SM=1, NVML_CLOCK_MEM=2,
        nvmlInit=lambda: calls.append("init"), nvmlShutdown=lambda: calls.append("shutdown"),
        nvmlDeviceGetHandleByIndex=lambda i: f"handle{i}",
        nvmlDeviceGetName=lambda h: b"NVIDIA H200", nvmlSystemGetDriverVersion=lambda: "580.159.04",
        nvmlDeviceGetMemoryInfo=lambda h: types.SimpleNamespace(total=150_000_000_000),
        nvmlDeviceGetMaxClockInfo=lambda h, kind: {1: 1980, 2: 3201}[kind],
        nvmlDeviceGetClockInfo=lambda h, kind: {1: 345, 2: 3201}[kind],
        nvmlDeviceGetPowerManagementLimit=lambda h: 700_000,
        nvmlDeviceGetEnforcedPowerLimit=lambda h: (_ for _ in ()).throw(NVMLError("Not Supported")),
    )
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    info = bench_machine.nvml_info(0)
    assert info["name"] == "NVIDIA H200" and info["driver"] == "580.159.04"
    assert info["memory_total_bytes"] == 150_000_000_000 and info["sm_clock_max_mhz"] == 1980
    assert info["mem_clock_mhz"] == 3201 and math.isclose(info["power_limit_w"], 700.0)
    assert info["enforced_power_limit_w"] == "error: Not Supported"
    assert calls == ["init", "shutdown"]
    fake.nvmlInit = lambda: (_ for _ in ()).throw(NVMLError("Driver Not Loaded"))
    assert bench_machine.nvml_info(0) == "nvmlInit failed: Driver Not Loaded"


def test_gram_workspace_is_planned_at_its_group_budget():
    """The gram path launches groups whose Gram matrices fit GRAM_MAX_BYTES, so a point plans for that much, not
    for every session's n^2 at once (8192 x 1024^2 fp32 would be 32 GiB), and none when G stays on chip."""
    pytest.importorskip("torch")
    pytest.importorskip("triton")
    from gemkernels.select.backends.triton_backend import GRAM_MAX_BYTES

    big, small = Point("fixed", "fp32", 8192, 1024, 384, 16), Point("fixed", "fp32", 4, 64, 384, 16)
    for point, contender, gram in ((big, "triton-gram", GRAM_MAX_BYTES + 4 * 1024 ** 2),
                                   (small, "triton-gram", 0),  # 64 rows: G is computed on chip
                                   (small, "triton-gram-global", 4 * 4 * 64 ** 2 + 4 * 4 * 64 * 16)):
        x32 = point.sessions * point.n * point.d * 4
        assert bench_point.memory_need(point, [contender], 2, "cuda") == {"cuda": 2 * point.x_bytes + x32 + gram}


def test_report_without_matplotlib_names_the_extra_and_the_way_out(subgrid, monkeypatch):
    out, _, _ = subgrid
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib now raises ImportError
    with pytest.raises(SystemExit, match=r"pip install 'gemkernels\[bench\]'.*or pass --no-plots"):
        bench_report.write_report(out)
    assert bench_report.write_report(out, plots=False) == [out / "results.md"]
