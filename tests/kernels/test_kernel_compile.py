"""The Triton kernels compile ahead of time for a Hopper GPU, proven on machines without one."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("triton")

TESTS = Path(__file__).resolve().parents[1]


def compile_for_sm90(script_args: list[str]) -> str:
    """tests/compile_kernels.py run for sm_90 without the interpreter; its output (it must succeed)."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run([sys.executable, *script_args], env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-4000:]
    return done.stdout


COMPILED = re.compile(r"^sm_90 .*bytes of cubin, (\d+) registers, (\d+) bytes spilled$", re.M)


def test_every_kernel_compiles_for_sm90_without_spills():
    """Every variant the triton backend launches compiles, and ptxas keeps it in registers: a spill would put
    loads to local memory inside the passes over X that bound the kernels."""
    sys.path.insert(0, str(TESTS))
    from compile_kernels import variants

    stdout = compile_for_sm90([str(TESTS / "compile_kernels.py"), "90"])
    compiled = COMPILED.findall(stdout)
    assert len(compiled) == len(list(variants())) >= 30, stdout
    assert all(spilled == "0" for _, spilled in compiled), stdout


#: compile_kernels.main over greedy_exact at the default tiles (its int8 flags from before the Cholesky greedies ran,
#: its session count an int).
EXACT_VARIANTS = """
import sys
sys.path.insert(0, sys.argv[1])
import compile_kernels
from gemkernels.kernels.greedy_exact import EXACT_WARPS, greedy_exact_kernel
compile_kernels.POINTER_TYPES["candidate_init_ptr"] = "*i8"
compile_kernels.INTS["i32"] += ("sessions",)
compile_kernels.variants = lambda: [("greedy_exact", greedy_exact_kernel, x, dict(BLOCK_N=128, BLOCK_D=16),
                                     EXACT_WARPS) for x in ("*fp32", "*fp16", "*bf16")]
sys.exit(compile_kernels.main([90]))
"""


def test_the_exact_greedy_compiles_for_sm90_without_spills():
    """greedy_exact, launched after every Cholesky greedy, at the tiles the triton backend gives it."""
    stdout = compile_for_sm90(["-c", EXACT_VARIANTS, str(TESTS)])
    compiled = COMPILED.findall(stdout)
    assert len(compiled) == 3 and all(spilled == "0" for _, spilled in compiled), stdout
