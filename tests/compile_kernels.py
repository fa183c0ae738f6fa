"""Compile every Triton kernel ahead of time for CUDA targets, without a GPU (ptxas ships with triton).

Run without TRITON_INTERPRET; prints one line per kernel variant and exits non-zero on the first failure.
Usage: python tests/compile_kernels.py [ARCH ...]   (default: 80 90)
Each line ends with ptxas's register count and spilled bytes (stores) for the kernel.
"""

import contextlib
import io
import itertools
import os
import re
import sys

import triton
from gemkernels.kernels.gram import TILE_CANDIDATES, gram_kernel
from gemkernels.kernels.greedy_fused import greedy_fused_kernel
from gemkernels.kernels.greedy_resident import SOURCES, greedy_resident_kernel, resident_blocks, resident_fits
from gemkernels.kernels.greedy_stepwise import pivot_direction_kernel, residual_update_kernel
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

INTS = {"i32": ("d", "stride_x", "total_rows", "width", "n"), "fp32": ("eps",)}
POINTER_TYPES = {
    "offsets_ptr": "*i64", "gram_offsets_ptr": "*i64", "protected_offsets_ptr": "*i64", "indices_ptr": "*i64",
    "counts_ptr": "*i64", "protected_idx_ptr": "*i32", "capacity_ptr": "*i32", "directions_ptr": "*i32",
    "tile_session_ptr": "*i32", "tile_start_ptr": "*i32", "tile_row_ptr": "*i32", "tile_col_ptr": "*i32",
    "candidate_ptr": "*i8", "adding_ptr": "*i8", "running_ptr": "*i8",
}


def source(fn, x_dtype: str, constexprs: dict) -> ASTSource:
    signature = {}
    for name in fn.arg_names:
        if name in constexprs:
            signature[name] = "constexpr"
        elif name == "x_ptr":
            signature[name] = x_dtype
        elif name in POINTER_TYPES:
            signature[name] = POINTER_TYPES[name]
        else:
            signature[name] = next((t for t, names in INTS.items() if name in names), "*fp32")
    return ASTSource(fn=fn, signature=signature,
                     constexprs={(fn.arg_names.index(k),): v for k, v in constexprs.items()})


#: Sessions (rows, steps) for the register-resident greedy: the headline, the largest tiles it takes per source,
#: the least, and k = n (the cache-aware preset selects until tau).
RESIDENT_SHAPES = ((256, 16), (256, 32), (1024, 16), (512, 32), (256, 64), (16, 16), (128, 128), (64, 64),
                   (128, 16), (128, 32))


def variants():
    """(name, kernel, x pointer type, constexprs, num_warps or (num_warps, num_stages)) at the tiles the triton
    backend launches, and the Gram tile candidates."""
    for x_dtype in ("*fp32", "*fp16", "*bf16"):
        for from_gram in (False, True):
            yield "greedy_fused", greedy_fused_kernel, x_dtype, dict(FROM_GRAM=from_gram, BLOCK_N=128, BLOCK_D=16,
                                                                     BLOCK_W=16), 4
        for source, (n_max, width) in itertools.product(SOURCES, RESIDENT_SHAPES):
            if resident_fits(n_max, width, source):
                block_n, block_w, block_d, num_warps = resident_blocks(n_max, width, source)
                for even_d in (True, False) if source == "chip" else (False,):  # EVEN_D only matters on chip
                    yield "greedy_resident", greedy_resident_kernel, x_dtype, dict(
                        SOURCE=source, BLOCK_N=block_n, BLOCK_W=block_w, BLOCK_D=block_d, EVEN_D=even_d,
                        INPUT_PRECISION="ieee" if x_dtype == "*fp32" else "tf32"), num_warps
        precision = "ieee" if x_dtype == "*fp32" else "tf32"
        for i, (block_m, block_k, warps, stages) in enumerate(TILE_CANDIDATES):
            for even_k in (True, False) if i == 0 else (True,):  # the default both ways, the candidates for d % 32 = 0
                if i == 0 or x_dtype != "*fp16":
                    yield "gram", gram_kernel, x_dtype, dict(BLOCK_M=block_m, BLOCK_K=block_k, EVEN_K=even_k,
                                                            INPUT_PRECISION=precision), (warps, stages)
        yield "pivot_direction", pivot_direction_kernel, x_dtype, dict(BLOCK_N=128, BLOCK_D=128), 4
        yield "residual_update", residual_update_kernel, x_dtype, dict(BLOCK_N=128, BLOCK_D=16), 4


def main(archs: list[int]) -> int:
    if os.environ.get("TRITON_INTERPRET") == "1":
        print("unset TRITON_INTERPRET: the interpreter cannot compile kernels", file=sys.stderr)
        return 2
    triton.knobs.nvidia.dump_ptxas_log = True
    triton.knobs.compilation.always_compile = True  # a cached kernel would bring no ptxas log
    for arch, (name, fn, x_dtype, constexprs, launch) in itertools.product(archs, variants()):
        num_warps, num_stages = launch if isinstance(launch, tuple) else (launch, 3)
        log = io.StringIO()
        with contextlib.redirect_stdout(log):
            kernel = triton.compile(source(fn, x_dtype, constexprs), target=GPUTarget("cuda", arch, 32),
                                    options={"num_warps": num_warps, "num_stages": num_stages})
        registers = re.search(r"Used (\d+) registers", log.getvalue())
        spills = re.search(r"(\d+) bytes spill stores", log.getvalue())
        print(f"sm_{arch} {name} x={x_dtype} {constexprs} warps={num_warps} stages={num_stages}: "
              f"{len(kernel.asm['cubin'])} bytes of cubin, {registers and registers[1]} registers, "
              f"{spills[1] if spills else 0} bytes spilled")
    return 0


if __name__ == "__main__":
    sys.exit(main([int(a) for a in sys.argv[1:]] or [80, 90]))
