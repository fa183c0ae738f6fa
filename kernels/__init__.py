"""Triton kernels for GEM's greedy residual selection (installed as ``gemkernels.kernels``).

One concern per module, each with its launch wrapper:
``pivot`` (device helpers shared by the greedy kernels), ``greedy_fused`` (the whole greedy
of every session in one launch, on X or on a precomputed Gram matrix), ``gram`` (ragged
per-session Gram matrices on tensor cores) and ``greedy_stepwise`` (one launch per step:
pivot + MGS basis growth, then the ragged residual update).
"""
