"""The whole greedy of the sessions a Cholesky greedy handed back, selected again by explicit Gram-Schmidt.

``greedy_resident`` and ``greedy_fused`` downdate residuals as ``1 - ||c||^2`` from fp32 Gram rows; at a
near-dependent pivot (``pivot.NEAR_DEPENDENCE``) that has lost most of its digits, so they stop the session there
with count -1 rather than carry that state in their registers (DESIGN.md §1.1). This kernel, launched after them,
selects exactly those sessions again from the start, as the stepwise greedy does in one program: each pivot's
direction is its row's orthogonal component against the explicit d-space basis (`pivot.choose_exact`, which also
replaces a near-dependent pivot's residual by its exact one), then one pass over X updates the residuals.
`EXACT_PROGRAMS` programs stride over the sessions, each with one basis in scratch, and skip the others.
"""

import torch
import triton
import triton.language as tl

from .launch import session_basis
from .pivot import adds_direction, choose_exact, coverage_of, downdate_rows, normalise, session_scalars

#: Programs of a launch, at most: each keeps one explicit basis (width x d fp32) in scratch, so they bound its
#: memory; handed-back sessions are rare.
EXACT_PROGRAMS = 512
#: Warps of a program: at the default 128 x 16 X tile, 8 compile without spills (tests/kernels/test_kernel_compile.py).
EXACT_WARPS = 8


@triton.jit(do_not_specialize=["width", "sessions"])
def greedy_exact_kernel(
    x_ptr, inv_norm_ptr, offsets_ptr, protected_idx_ptr, protected_offsets_ptr, candidate_init_ptr, candidate_ptr,
    tau_ptr, capacity_ptr, residuals_ptr, exact_ptr, basis_ptr, indices_ptr, counts_ptr, coverage_ptr,
    eps, d, stride_x, width, sessions,
    BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
):
    """Sessions ``program_id(0)``, then every ``num_programs(0)``-th after it, whose count is -1: each one's
    selection from ``candidate_init_ptr`` (the candidate flags before any greedy consumed them), written over the
    handed-back one."""
    basis = basis_ptr + tl.program_id(0).to(tl.int64) * width * d
    rows = tl.arange(0, BLOCK_N)
    for s0 in range(0, sessions, tl.num_programs(0)):
        s = s0 + tl.program_id(0)
        if tl.load(counts_ptr + s, mask=s < sessions, other=0) < 0:
            start, n, p_start, num_protected, tau, capacity = session_scalars(s, offsets_ptr, protected_offsets_ptr,
                                                                              tau_ptr, capacity_ptr)
            selection_ptr = indices_ptr + s.to(tl.int64) * width
            for c0 in range(0, n, BLOCK_N):
                m = c0 + rows < n
                tl.store(residuals_ptr + start + c0 + rows, tl.full([BLOCK_N], 1.0, tl.float32), mask=m)
                tl.store(exact_ptr + start + c0 + rows, tl.full([BLOCK_N], 1.0, tl.float32), mask=m)
                tl.store(candidate_ptr + start + c0 + rows, tl.load(candidate_init_ptr + start + c0 + rows, mask=m),
                         mask=m)
            for c0 in range(0, width, BLOCK_N):
                tl.store(selection_ptr + c0 + rows, tl.full([BLOCK_N], -1, tl.int64), mask=c0 + rows < width)
            tl.debug_barrier()  # the state above before the first pivot reads it
            t = 0
            directions = 0
            residual_sum = n * 1.0
            running = 1
            while running != 0:
                pivot, stopped, r_exact, residual_sum = choose_exact(
                    x_ptr, inv_norm_ptr, residuals_ptr, exact_ptr, candidate_ptr, protected_idx_ptr + p_start, basis,
                    start, n, t, num_protected, capacity, tau, eps, residual_sum, directions, d, stride_x, BLOCK_N,
                    BLOCK_D)
                if stopped:
                    running = 0
                else:
                    tl.store(selection_ptr + t, pivot.to(tl.int64))
                    tl.store(candidate_ptr + start + pivot, tl.zeros([], tl.int8))
                    t += 1
                    if adds_direction(r_exact, eps):
                        q_ptr = basis + directions * d
                        normalise(q_ptr, r_exact, d, BLOCK_D)
                        residual_sum = 0.0
                        for c0 in range(0, n, BLOCK_N):
                            local = c0 + rows
                            residual_sum += downdate_rows(x_ptr, inv_norm_ptr, residuals_ptr, start, local, local < n,
                                                          q_ptr, d, stride_x, BLOCK_N, BLOCK_D)
                        directions += 1
                    tl.debug_barrier()  # this step's stores before the next pivot's loads
            tl.store(counts_ptr + s, t.to(tl.int64))
            tl.store(coverage_ptr + s, coverage_of(residual_sum, n))


def greedy_exact(x: torch.Tensor, inv_norm: torch.Tensor, offsets: torch.Tensor, protected_idx: torch.Tensor,
                 protected_offsets: torch.Tensor, candidate_init: torch.Tensor, tau: torch.Tensor,
                 capacity: torch.Tensor, eps: float, width: int, out: tuple, block_n: int = 128,
                 block_d: int = 16) -> tuple:
    """Select again, in place in ``out`` (a Cholesky greedy's (indices, counts, coverage, residuals)), the sessions
    whose count is -1; ``candidate_init`` holds the int8 candidate flags as they were before that greedy ran.

    ``block_n`` x ``block_d`` is the X tile of the residual update, ``block_d`` also the chunk of the d-space loops;
    the launch is at most `EXACT_PROGRAMS` programs, which skip the sessions not handed back."""
    indices, counts, coverage, residuals = out
    sessions = offsets.numel() - 1
    programs = min(sessions, EXACT_PROGRAMS)
    greedy_exact_kernel[(programs,)](
        x, inv_norm, offsets, protected_idx, protected_offsets, candidate_init, torch.empty_like(candidate_init), tau,
        capacity, residuals, torch.empty_like(residuals), session_basis(programs, width, x.shape[1], x.device), indices,
        counts, coverage, eps, x.shape[1], x.stride(0), width, sessions, BLOCK_N=block_n, BLOCK_D=block_d,
        num_warps=EXACT_WARPS,
    )
    return out
