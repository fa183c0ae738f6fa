"""The Triton kernels compile ahead of time for a Hopper GPU as the JIT compiles them, proven on machines without
one: no register spills, aligned and not, and in the Triton IR and PTX what the kernels promise a GPU: IEEE
square roots and divisions where ties are decided, a barrier where one thread reads what another wrote, 64-bit
offsets where a batch passes 2^31 elements, and no atomics."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("triton")

TESTS = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(TESTS))
from compile_kernels import variants  # noqa: E402

COMPILED = re.compile(r"^sm_90 #(\d+) (\w+) x=\S+ aligned=(True|False) .*bytes of cubin, (\d+) registers, "
                      r"(\d+) bytes spilled$", re.M)


@pytest.fixture(scope="module")
def compiled(tmp_path_factory) -> tuple[list, Path]:
    """One run of tests/compile_kernels.py for sm_90 without the interpreter (it must succeed): its lines as
    (index, kernel, aligned, registers, spilled) and the folder of each variant's Triton IR and PTX."""
    asm = tmp_path_factory.mktemp("asm")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run([sys.executable, str(TESTS / "compile_kernels.py"), "--asm", str(asm), "90"], env=env,
                          capture_output=True, text=True, timeout=1800)
    assert done.returncode == 0, done.stderr[-4000:]
    lines = [(int(i), name, aligned == "True", int(regs), int(spilled))
             for i, name, aligned, regs, spilled in COMPILED.findall(done.stdout)]
    return lines, asm


def assembly(asm: Path, index: int, name: str, ir: str) -> str:
    return (asm / f"sm_90-{index}-{name}.{ir}").read_text()


def test_every_kernel_compiles_for_sm90_without_spills(compiled):
    """Every variant the triton backend launches, aligned and not, compiles and ptxas keeps it in registers: a
    spill would put loads to local memory inside the passes over X that bound the kernels."""
    lines, _ = compiled
    expected = variants()
    assert [(i, name, aligned) for i, name, aligned, _, _ in lines] == [
        (i, v.name, v.aligned) for i, v in enumerate(expected)]
    assert {v.name for v in expected} == {"greedy_fused", "greedy_resident", "gram", "pivot_direction",
                                          "residual_update", "greedy_exact", "row_norms"}
    assert {v.aligned for v in expected} == {True, False}
    spilled = [line for line in lines if line[4] != 0]
    assert not spilled, spilled


def test_variants_carry_the_jit_specialisation(compiled):
    """An aligned launch is compiled with d, the row stride and X's address marked divisible by 16, as the JIT
    marks them (compiled without the marks, the register counts were not those of the kernels that run); an
    unaligned one without."""
    lines, asm = compiled
    for index, name, aligned, _, _ in lines:
        signature = assembly(asm, index, name, "ttir").split("tt.func public", 1)[1].split("\n", 1)[0]
        for arg in ("%x_ptr", "%d", "%stride_x"):
            marked = re.search(re.escape(arg) + r": [^{,]+ \{tt\.divisibility = 16", signature) is not None
            assert marked == aligned, (index, name, arg)


def greedy_lines(lines: list, *names: str) -> list:
    return [line for line in lines if line[1] in names]


def test_ties_are_decided_in_ieee_arithmetic(compiled):
    """``tl.sqrt`` and ``/`` compile to ``sqrt.approx.ftz`` and ``div.full``: a pivot's scale and a coverage that
    rounded differently from the other backends could flip a tie or the tau test. Every greedy takes them with
    ``sqrt.rn`` and ``div.rn``, and no kernel has an approximate or flushing one."""
    lines, asm = compiled
    for index, name, *_ in lines:
        ptx = assembly(asm, index, name, "ptx")
        assert not re.search(r"\b(sqrt|div|rcp|rsqrt)\.(approx|full)", ptx), (index, name)
        assert not re.search(r"\b(sqrt|div)\.rn\.ftz", ptx), (index, name)
    for index, name, *_ in greedy_lines(lines, "greedy_fused", "greedy_resident", "greedy_exact", "pivot_direction"):
        ptx = assembly(asm, index, name, "ptx")
        assert "sqrt.rn.f32" in ptx and "div.rn.f32" in ptx, (index, name)


def test_the_global_greedy_orders_each_step_after_the_last_with_a_barrier(compiled):
    """greedy_fused keeps its state in global memory: a step reads residuals, flags and coordinates that other
    threads of the program stored (at the start, or in the step before, in other layouts; with a row tile
    narrower than the threads only some lanes store). An explicit barrier is the first operation of every step,
    before its first load, and reaches the PTX."""
    lines, asm = compiled
    for index, name, *_ in greedy_lines(lines, "greedy_fused"):
        step = assembly(asm, index, name, "ttir").split("} do {", 1)[1]
        assert re.search(r"ttg\.barrier|gpu\.barrier", step.split("tt.load", 1)[0]), index
        assert "bar.sync" in assembly(asm, index, name, "ptx"), index


def test_offsets_that_can_pass_2_31_are_64_bit(compiled):
    """The Gram kernel's stores at ``rows * n + cols`` (n^2 passes 2^31 from n = 46,341) take int64 offsets
    (64-bit multiplies in the PTX), and no kernel narrows a session's first row to int32 (a batch may pass 2^31
    rows)."""
    lines, asm = compiled
    for index, name, *_ in greedy_lines(lines, "gram"):
        ttir = assembly(asm, index, name, "ttir")
        offset_bits = dict(re.findall(r"(%\w+) = tt\.addptr %\w+, %\w+ : [^,]+, tensor<[\dx]+x(i\d+)>", ttir))
        stores = [offset_bits.get(ptr) for ptr in re.findall(r"tt\.store (%\w+),", ttir)]
        assert stores == ["i64", "i64"], (index, stores)  # G[rows, cols] and its mirror
        assert re.search(r"\bmul\.(wide\.s32|lo\.s64)", assembly(asm, index, name, "ptx")), index
    for index, name, *_ in lines:
        ttir = assembly(asm, index, name, "ttir")
        assert re.search(r"%start\w* = tt\.load", ttir), (index, name)
        assert not re.search(r"arith\.trunci %start\w* : i64 to i32", ttir), (index, name)


def test_the_stepwise_greedy_has_no_atomics(compiled):
    """The stepwise residual sums are per-tile partial sums reduced in a fixed order: no fp32 atomic, whose result
    depends on the order the tiles run in, is left in any kernel."""
    lines, asm = compiled
    for index, name, *_ in lines:
        assert not re.search(r"^\s*(@!?%p\d+\s+)?(atom|red)\.", assembly(asm, index, name, "ptx"), re.M), (index, name)
