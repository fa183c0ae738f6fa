"""The selection kernels (installed as ``gemkernels.kernels``; a source checkout loads this folder under that
name). One concern per module, each with its launch wrapper.

Triton (CUDA, or Triton's CPU interpreter under ``TRITON_INTERPRET=1``), used by the triton backend:
``pivot`` (device helpers shared by the greedy kernels), ``gram`` (ragged per-session Gram matrices on tensor
cores, upper tiles mirrored; the in-register product the on-chip greedy uses), ``greedy_resident`` (the whole
greedy of a short session with its state in registers, Gram rows from G, from passes over X, or from G computed
on chip), ``greedy_fused`` (the same greedy with its state in global memory, for sessions too long for
registers), ``greedy_stepwise`` (one launch per step: pivot + Gram-Schmidt basis growth, then the residual update
over per-session row tiles), ``greedy_exact`` (the sessions the resident and fused greedies hand back at a
near-dependent pivot, selected again by explicit Gram-Schmidt) and ``launch`` (the buffers the greedy launchers
share, and the one pinned copy that takes a launch's host arrays to the device).

numba (CPU), used by the numba backend: ``greedy_cpu`` (the numpy backend's lazy pivoted Cholesky, compiled,
one session per call, releasing the GIL).
"""
