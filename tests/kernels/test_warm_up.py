"""The server's warm-up compiles every Triton kernel variant its batches launch (issue 18, item 8): fp16 and bf16 rows,
widths above 16 and below, and the paths batches of many sessions take. Each launch is recorded as the variant the
JIT compiles for it (its binder's specialisation: argument types, constexprs, divisibility by 16, warps and stages),
without running it, so the batches cost nothing here."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")
from select_helpers import backend_marks  # noqa: E402

#: the kernels do not run: the results hold whatever their buffers held
pytestmark = backend_marks("triton") + [pytest.mark.filterwarnings("ignore:Truncating the start/stop/step")]

DTYPES = ("float32", "float16", "bfloat16")


class VariantRecorder:
    """Stands in for a Triton kernel and does not run it: adds each launch's JIT variant to ``log`` (and clears the
    bad-row flags it would write, so that the selection goes on)."""

    def __init__(self, name: str, kernel, log: set):
        from triton.backends.compiler import GPUTarget
        from triton.compiler import make_backend
        from triton.runtime.jit import JITFunction, create_function_from_signature

        do_not_specialize = getattr(kernel, "kwargs", {}).get("do_not_specialize") or getattr(
            kernel, "do_not_specialize", None)
        jit = JITFunction(kernel.fn, do_not_specialize=do_not_specialize)
        self.binder = create_function_from_signature(jit.signature, jit.params, make_backend(GPUTarget("cuda", 90, 32)))
        self.name, self.log, self.arg_names = name, log, jit.arg_names

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            _, specialization, options = self.binder(*args, **kwargs)
            self.log.add((self.name, repr(specialization), repr(sorted(options.items()))))
            for name, arg in zip(self.arg_names, args):
                if name == "bad_rows_ptr":
                    arg.zero_()
        return launch


@pytest.fixture
def launched(monkeypatch) -> set:
    """The variants launched from here on (no kernel runs), with kernels compiling ahead as on a GPU."""
    from gemkernels.kernels import gram, greedy_exact, greedy_fused, greedy_resident, greedy_stepwise, norms

    from gemkernels.select.backends import triton_backend

    log: set = set()
    for module in (gram, greedy_exact, greedy_fused, greedy_resident, greedy_stepwise, norms):
        for name in [n for n in vars(module) if n.endswith("_kernel")]:
            monkeypatch.setattr(module, name, VariantRecorder(name, getattr(module, name), log))
    monkeypatch.setattr(triton_backend, "compiles_ahead", lambda: True)
    # as on a GPU, bf16 rows stay bf16 (the interpreter widens them to fp32; no kernel runs here)
    monkeypatch.setattr(triton_backend, "widened", lambda dtype, device: dtype == torch.float64)
    return log


def server_batches(rng: np.random.Generator, dim: int, k: int | None, max_rows: int, max_batch: int):
    """Random batches a server could send: 1 to max_batch sessions of one dtype, lengths uniform, all equal, or one
    long among short ones, up to every row protected (K_t past k), k per session (None: as many as rows)."""
    for trial in range(120):
        sessions = int(rng.integers(1, max_batch + 1))
        shape = trial % 3
        lengths = (rng.integers(1, max_rows + 1, sessions) if shape == 0
                   else np.full(sessions, rng.integers(1, max_rows + 1)) if shape == 1
                   else np.concatenate([[rng.integers(1, max_rows + 1)], rng.integers(1, 20, sessions - 1)]))
        dtype = getattr(torch, DTYPES[trial % len(DTYPES)])
        xs = [torch.from_numpy(rng.standard_normal((int(n), dim)).astype(np.float32)).to(dtype) for n in lengths]
        protected = [rng.choice(int(n), size=int(rng.integers(0, n + 1)) if rng.random() < 0.3 else min(2, int(n)),
                                replace=False) for n in lengths]
        yield xs, protected, [int(n) if k is None else k for n in lengths]


@pytest.mark.parametrize("dim,k", [(24, 4), (32, None)])
def test_warm_up_launches_every_variant_a_servers_batches_launch(launched, dim, k):
    """After `warm_up` for fp32, fp16 and bf16 rows, batches of up to 8 sessions of up to 300 rows, no random server
    batch launches a variant the warm-up did not (the warm-up of fp32 rows of 16 to max_rows rows, k steps, alone
    and in pairs, missed fp16 and bf16, widths below 16 and above k, and paths that only many sessions take)."""
    import gemkernels as gk
    from gemkernels.select.api import warm_up

    runs = warm_up("triton", dim, k=k, max_rows=300, max_batch=8, dtypes=DTYPES)
    warmed = set(launched)
    assert {run.dtype for run in runs} == set(DTYPES) and max(run.rows for run in runs) <= 300
    launched.clear()
    for xs, protected, ks in server_batches(np.random.default_rng(dim), dim, k, 300, 8):
        gk.select_batch(xs, protected=protected, k=ks, tau=0.9, backend="triton")
    assert launched <= warmed, f"{len(launched - warmed)} variants not warmed up: {sorted(launched - warmed)[:3]}"


def test_each_warm_up_batch_launches_a_variant_the_earlier_ones_did_not(launched):
    """No batch of the plan compiles nothing new (each costs a second or more on a GPU)."""
    import gemkernels as gk
    from gemkernels.select.backends import triton_backend

    runs = triton_backend.warm_up_shapes(24, 16, 600, 64, "float16")
    before = 0
    for run in runs:
        x = torch.randn(run.rows, 24, dtype=torch.float16)
        gk.select_batch([x[:n] for n in run.lengths], k=run.steps, backend="triton")
        assert len(launched) > before, run
        before = len(launched)


def test_warm_up_shapes_cover_both_ends_of_each_width_bucket():
    from gemkernels.select.backends.triton_backend import width_ends

    assert width_ends(1, 16) == [1, 2, 3, 4, 5, 8, 9, 16]
    assert width_ends(4, 40) == [4, 5, 8, 9, 16, 17, 32, 33, 40]
    assert width_ends(7, 7) == [7]


def test_the_interpreter_compiles_nothing_ahead():
    from gemkernels.select.api import warm_up
    from gemkernels.select.backends import triton_backend

    if triton_backend.compiles_ahead():
        pytest.skip("kernels compile ahead here")
    assert warm_up("triton", 24, k=5, max_rows=40, dtypes=DTYPES) == []
