"""Compile every Triton kernel ahead of time for CUDA targets, without a GPU (ptxas ships with triton), as the JIT
compiles the launches that run.

The JIT specialises each launch on its arguments: an integer or a pointer divisible by 16 (bytes, for a pointer)
is marked ``tt.divisibility = 16``, which lets loads vectorise and changes the registers a kernel takes. Every
variant here gets its signature and those marks from the JIT's own binder, fed arguments like a launch's, and is
compiled twice: with X's rows aligned (d, its row stride and its address multiples of 16, the usual case) and not
(d % 16 != 0, X at an odd address: no mark on any of them), each at the tiles the triton backend launches for it.

Run without TRITON_INTERPRET; prints one line per kernel variant and exits non-zero on the first failure.
Usage: python tests/compile_kernels.py [--asm DIR] [ARCH ...]   (default: 80 90)
Each line ends with ptxas's register count and spilled bytes (stores) for the kernel; ``--asm DIR`` also writes
each variant's Triton IR and PTX as ``DIR/sm_<arch>-<index>-<kernel>.{ttir,ptx}``.
"""

import argparse
import contextlib
import io
import itertools
import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import triton
from gemkernels.kernels.gram import TILE_CANDIDATES, gram_kernel
from gemkernels.kernels.greedy_exact import EXACT_WARPS, greedy_exact_kernel
from gemkernels.kernels.greedy_fused import greedy_fused_kernel
from gemkernels.kernels.greedy_resident import SOURCES, greedy_resident_kernel, resident_blocks, resident_fits
from gemkernels.kernels.greedy_stepwise import pivot_direction_kernel, residual_update_kernel
from gemkernels.kernels.norms import row_norms_kernel
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource, make_backend
from triton.runtime.jit import create_function_from_signature

from gemkernels.select.backends.triton_backend import STREAM_BLOCK_D

#: The element type of each pointer argument that is not fp32 (X's is the variant's).
POINTER_TYPES = {
    "offsets_ptr": torch.int64, "gram_offsets_ptr": torch.int64, "protected_offsets_ptr": torch.int64,
    "indices_ptr": torch.int64, "counts_ptr": torch.int64, "tile_offsets_ptr": torch.int64,
    "coord_offsets_ptr": torch.int64, "basis_offsets_ptr": torch.int64,
    "protected_idx_ptr": torch.int32, "capacity_ptr": torch.int32, "directions_ptr": torch.int32,
    "tile_session_ptr": torch.int32, "tile_start_ptr": torch.int32, "tile_row_ptr": torch.int32,
    "tile_col_ptr": torch.int32, "candidate_ptr": torch.int8, "candidate_init_ptr": torch.int8,
    "adding_ptr": torch.int8, "running_ptr": torch.int8, "bad_rows_ptr": torch.int8, "bad_sessions_ptr": torch.int8,
}
X_DTYPES = {"*fp32": torch.float32, "*fp16": torch.float16, "*bf16": torch.bfloat16}
#: d (and X's row stride) of an aligned and of an unaligned launch; the other integers (row totals, widths, session
#: counts) are not specialised (``do_not_specialize``), so any value compiles the same code.
DIMS = {True: 1024, False: 1000}
OTHER_INTS = 4096


@dataclass(frozen=True)
class Variant:
    """One compiled kernel: the kernel, X's pointer type, its constexprs, the launch and whether X is aligned."""

    name: str
    fn: Any
    x_dtype: str
    constexprs: dict
    num_warps: int
    num_stages: int = 3
    aligned: bool = True


def launch_arguments(fn, x_dtype: str, aligned: bool) -> dict:
    """Arguments shaped like a launch's for every runtime parameter of ``fn`` (tiny tensors: only their dtype and
    address alignment matter to the JIT)."""
    args = {}
    for name in fn.arg_names:
        if name == "x_ptr":
            x = torch.empty(33, dtype=X_DTYPES[x_dtype])
            args[name] = x if aligned else x[1:]  # an odd element: off a 16-byte boundary
        elif name.endswith("_ptr"):
            args[name] = torch.empty(16, dtype=POINTER_TYPES.get(name, torch.float32))
        elif name == "eps":
            args[name] = 1e-6
        elif name in ("d", "stride_x"):
            args[name] = DIMS[aligned]
        elif not name.isupper():
            args[name] = OTHER_INTS
    return args


def source(variant: Variant, target: GPUTarget) -> ASTSource:
    """The ASTSource the JIT would build for this launch: signature, constexprs and divisibility attributes from the
    JIT's binder."""
    fn = variant.fn
    backend = make_backend(target)
    binder = create_function_from_signature(fn.signature, fn.params, backend)
    launch = dict(variant.constexprs, num_warps=variant.num_warps, num_stages=variant.num_stages)
    bound, specialization, options = binder(**launch_arguments(fn, variant.x_dtype, variant.aligned), **launch)
    _, signature, constexprs, attrs = fn._pack_args(backend, launch, bound, specialization, options)
    return ASTSource(fn=fn, signature=signature, constexprs=constexprs, attrs=attrs)


#: Sessions (rows, steps) for the register-resident greedy: the headline, the largest tiles it takes per source,
#: the least, and k = n (the cache-aware preset selects until tau).
RESIDENT_SHAPES = ((256, 16), (256, 32), (1024, 16), (512, 32), (256, 64), (16, 16), (128, 128), (64, 64),
                   (128, 16), (128, 32))


def variants() -> list[Variant]:
    """Every kernel at the tiles the triton backend launches, for each X dtype, aligned and not, and the Gram tile
    candidates (aligned: they are tuned for d % 32 = 0)."""
    out = []
    for aligned, x_dtype in itertools.product((True, False), X_DTYPES):
        stream_d = STREAM_BLOCK_D[aligned]
        precision = "ieee" if x_dtype == "*fp32" else "tf32"
        for from_gram in (False, True):
            out.append(Variant("greedy_fused", greedy_fused_kernel, x_dtype, dict(
                FROM_GRAM=from_gram, BLOCK_N=128, BLOCK_D=stream_d, BLOCK_W=16), 4, aligned=aligned))
        for source_, (n_max, width) in itertools.product(SOURCES, RESIDENT_SHAPES):
            if resident_fits(n_max, width, source_):
                block_n, block_w, block_d, num_warps = resident_blocks(n_max, width, source_)
                # EVEN_D (BLOCK_D divides d) only matters on chip, and implies an aligned d
                for even_d in ((True, False) if aligned else (False,)) if source_ == "chip" else (False,):
                    out.append(Variant("greedy_resident", greedy_resident_kernel, x_dtype, dict(
                        SOURCE=source_, BLOCK_N=block_n, BLOCK_W=block_w, BLOCK_D=block_d, EVEN_D=even_d,
                        INPUT_PRECISION=precision), num_warps, aligned=aligned))
        for i, (block_m, block_k, warps, stages) in enumerate(TILE_CANDIDATES):
            # the default both ways (EVEN_K: BLOCK_K divides d, so d is aligned), the candidates for d % 32 = 0
            for even_k in ((True, False) if aligned else (False,)) if i == 0 else (True,):
                if i == 0 or (aligned and x_dtype != "*fp16"):
                    out.append(Variant("gram", gram_kernel, x_dtype, dict(
                        BLOCK_M=block_m, BLOCK_K=block_k, EVEN_K=even_k, INPUT_PRECISION=precision), warps, stages,
                        aligned=aligned))
        out.append(Variant("pivot_direction", pivot_direction_kernel, x_dtype, dict(BLOCK_N=128, BLOCK_D=128), 4,
                           aligned=aligned))
        out.append(Variant("residual_update", residual_update_kernel, x_dtype, dict(BLOCK_N=128, BLOCK_D=stream_d),
                           4, aligned=aligned))
        out.append(Variant("greedy_exact", greedy_exact_kernel, x_dtype, dict(BLOCK_N=128, BLOCK_D=stream_d),
                           EXACT_WARPS, aligned=aligned))
        for from_gram in (False, True):
            out.append(Variant("row_norms", row_norms_kernel, x_dtype, dict(
                FROM_GRAM=from_gram, BLOCK_N=128, BLOCK_D=stream_d), 4, aligned=aligned))
    return out


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--asm", type=Path, help="write each variant's Triton IR and PTX here")
    parser.add_argument("archs", nargs="*", type=int, default=[80, 90])
    args = parser.parse_args(argv)
    if os.environ.get("TRITON_INTERPRET") == "1":
        print("unset TRITON_INTERPRET: the interpreter cannot compile kernels", file=sys.stderr)
        return 2
    if args.asm:
        args.asm.mkdir(parents=True, exist_ok=True)
    triton.knobs.nvidia.dump_ptxas_log = True
    triton.knobs.compilation.always_compile = True  # a cached kernel would bring no ptxas log
    for arch in args.archs:
        target = GPUTarget("cuda", arch, 32)
        for index, v in enumerate(variants()):
            log = io.StringIO()
            with contextlib.redirect_stdout(log):
                kernel = triton.compile(source(v, target), target=target,
                                        options={"num_warps": v.num_warps, "num_stages": v.num_stages})
            if args.asm:
                for ir in ("ttir", "ptx"):
                    (args.asm / f"sm_{arch}-{index}-{v.name}.{ir}").write_text(kernel.asm[ir])
            registers = re.search(r"Used (\d+) registers", log.getvalue())
            spills = re.search(r"(\d+) bytes spill stores", log.getvalue())
            print(f"sm_{arch} #{index} {v.name} x={v.x_dtype} aligned={v.aligned} {v.constexprs} "
                  f"warps={v.num_warps} stages={v.num_stages}: {len(kernel.asm['cubin'])} bytes of cubin, "
                  f"{registers and registers[1]} registers, {spills[1] if spills else 0} bytes spilled", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
