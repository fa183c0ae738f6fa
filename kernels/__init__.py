"""Triton kernels for GEM's greedy residual selection (installed as ``gemkernels.kernels``).

One concern per module, each with its launch wrapper:
``pivot`` (device helpers shared by the greedy kernels), ``gram`` (ragged per-session Gram
matrices on tensor cores, upper tiles mirrored; the in-register product the on-chip greedy
uses), ``greedy_resident`` (the whole greedy of a short session with its state in registers,
Gram rows from G, from passes over X, or from G computed on chip), ``greedy_fused`` (the same
greedy with its state in global memory, for sessions too long for registers) and
``greedy_stepwise`` (one launch per step: pivot + MGS basis growth, then the residual update
over per-session row tiles).
"""
