"""The Triton kernels' arithmetic where a GPU would differ from a careless reading, in Triton's interpreter: int64
offsets past 2^31, an exactly symmetric Gram tile, no direction from a residual a GPU flushes to zero, and a
stepwise greedy whose answer does not depend on the order its row tiles run in. (What only the compiled code shows,
IEEE square roots and divisions, barriers, 64-bit address arithmetic and the absence of atomics, is tested on the
PTX in tests/kernels/test_kernel_compile.py.)"""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
triton = pytest.importorskip("triton")
pytest.importorskip("hypothesis")
import triton.language as tl  # noqa: E402
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from select_helpers import backend_marks  # noqa: E402

pytestmark = backend_marks("triton")

from gemkernels.kernels.gram import entry_offsets, unit_gram_tile  # noqa: E402
from gemkernels.kernels.pivot import session_scalars  # noqa: E402


@triton.jit
def session_scalars_kernel(offsets_ptr, protected_offsets_ptr, tau_ptr, capacity_ptr, out_ptr):
    """Stores session 1's (start, n, p_start, num_protected) as int64."""
    start, n, p_start, num_protected, _, _ = session_scalars(1, offsets_ptr, protected_offsets_ptr, tau_ptr,
                                                             capacity_ptr)
    tl.store(out_ptr, start.to(tl.int64))
    tl.store(out_ptr + 1, n.to(tl.int64))
    tl.store(out_ptr + 2, p_start.to(tl.int64))
    tl.store(out_ptr + 3, num_protected.to(tl.int64))


def test_session_offsets_past_2_31_stay_exact():
    """A batch whose session starts past row 2^31 (2^31 rows of d = 16 bf16 are 64 GiB: an H200 holds them): the
    first row and the first protected entry are int64, as every kernel's pointer arithmetic needs them."""
    from gemkernels.select.backends.triton_backend import kernel_device

    big = 2 ** 31
    offsets = torch.tensor([0, big + 7, big + 19], dtype=torch.int64, device=kernel_device())
    protected_offsets = torch.tensor([0, big + 1, big + 4], dtype=torch.int64, device=kernel_device())
    out = torch.zeros(4, dtype=torch.int64, device=kernel_device())
    session_scalars_kernel[(1,)](offsets, protected_offsets, torch.ones(2, device=kernel_device()),
                                 torch.ones(2, dtype=torch.int32, device=kernel_device()), out)
    assert out.tolist() == [big + 7, 12, big + 1, 3]


@triton.jit
def entry_offsets_kernel(rows_ptr, cols_ptr, n, entry_ptr, mirror_ptr, BLOCK: tl.constexpr):
    """Stores `entry_offsets` of the BLOCK x BLOCK tile at the given rows and columns."""
    rows = tl.load(rows_ptr + tl.arange(0, BLOCK))
    cols = tl.load(cols_ptr + tl.arange(0, BLOCK))
    entry, mirror = entry_offsets(rows, cols, n)
    at = tl.arange(0, BLOCK)[:, None] * BLOCK + tl.arange(0, BLOCK)[None, :]
    tl.store(entry_ptr + at, entry)
    tl.store(mirror_ptr + at, mirror)


def test_gram_entry_offsets_are_exact_past_2_31():
    """The last rows of a forced ``path="gram"`` session of 46,341 rows: n^2 > 2^31, and in int32 ``rows * n +
    cols`` wrapped to negative offsets (a write out of bounds)."""
    from gemkernels.select.backends.triton_backend import kernel_device

    n = 46_341
    rows = np.arange(n - 16, n, dtype=np.int32)
    cols = np.arange(n - 16 * 97, n, 97, dtype=np.int32)
    entry = torch.empty((16, 16), dtype=torch.int64, device=kernel_device())
    mirror = torch.empty_like(entry)
    entry_offsets_kernel[(1,)](torch.from_numpy(rows).to(kernel_device()), torch.from_numpy(cols).to(kernel_device()),
                               n, entry, mirror, BLOCK=16)
    r, c = rows.astype(np.int64)[:, None], cols.astype(np.int64)[None, :]
    np.testing.assert_array_equal(entry.cpu().numpy(), r * n + c)
    np.testing.assert_array_equal(mirror.cpu().numpy(), c * n + r)
    assert entry.max().item() >= 2 ** 31


@triton.jit
def gram_tile_kernel(x_ptr, out_ptr, inv_norm_ptr, bad_ptr, n, d, stride_x, BLOCK_M: tl.constexpr,
                     BLOCK_K: tl.constexpr):
    """Stores the session's whole normalised Gram tile, its inverse norms and bad-row flags, as the resident greedy
    computes them on chip."""
    rows = tl.arange(0, BLOCK_M)
    g, inv_norm, bad = unit_gram_tile(x_ptr, tl.zeros([], dtype=tl.int64), rows, n, d, stride_x, BLOCK_M, BLOCK_K,
                                      False, "ieee")
    tl.store(out_ptr + rows[:, None] * BLOCK_M + rows[None, :], g)
    tl.store(inv_norm_ptr + rows, inv_norm)
    tl.store(bad_ptr + rows, bad.to(tl.int8))


def chip_tile(x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(G, 1 / ||x_i||, bad flags) of rows ``x`` (at most 16) from `unit_gram_tile`, cut to the rows."""
    from gemkernels.select.backends.triton_backend import kernel_device

    n, d = x.shape
    out = torch.zeros((16, 16), dtype=torch.float32, device=kernel_device())
    inv_norm = torch.zeros(16, dtype=torch.float32, device=kernel_device())
    bad = torch.zeros(16, dtype=torch.int8, device=kernel_device())
    gram_tile_kernel[(1,)](torch.from_numpy(x).to(kernel_device()), out, inv_norm, bad, n, d, d, BLOCK_M=16,
                           BLOCK_K=16)
    return out.cpu().numpy()[:n, :n], inv_norm.cpu().numpy(), bad.cpu().numpy()


@settings(max_examples=15, deadline=None)
@given(st.integers(0, 2 ** 32 - 1), st.integers(2, 16), st.integers(1, 40))
def test_on_chip_gram_is_exactly_symmetric(seed, n, d):
    """G computed on chip scales each entry by one symmetric factor s_i s_j, s from its own diagonal (read along
    rows and along columns, the same bits): scaled as (acc s_i) s_j, G[i, j] and G[j, i] differed in the last bit in
    about one entry in four, so the on-chip greedy saw an asymmetric G."""
    x = np.random.default_rng(seed).standard_normal((n, d)).astype(np.float32)
    g, inv_norm, bad = chip_tile(x)
    np.testing.assert_array_equal(g, g.T)
    norms = np.linalg.norm(x.astype(np.float64), axis=1)
    np.testing.assert_allclose(inv_norm[:n], 1 / norms, rtol=1e-6)
    assert not inv_norm[n:].any() and not bad.any()
    unit = x.astype(np.float64) / norms[:, None]
    np.testing.assert_allclose(g, unit @ unit.T, atol=4e-6)


def test_on_chip_norms_flag_the_rows_fp32_cannot_normalise():
    """Zero, inf, NaN and overflowing rows (squared norm inf in fp32) are flagged with a zero scale; an fp32-tiny row
    whose squared norm is still a positive number is not."""
    x = np.random.default_rng(7).standard_normal((8, 20)).astype(np.float32)
    x[1] = 0
    x[3, 5] = np.inf
    x[4, 0] = np.nan
    x[6] = 3e19  # squares past fp32's largest
    x[7] *= 1e-18  # squared norm ~1e-35: small but normal
    _, inv_norm, bad = chip_tile(x)
    assert bad[:8].tolist() == [0, 1, 0, 1, 1, 0, 1, 0]
    assert not inv_norm[[1, 3, 4, 6]].any()
    np.testing.assert_allclose(inv_norm[[0, 2, 5, 7]], 1 / np.linalg.norm(x[[0, 2, 5, 7]].astype(np.float64), axis=1),
                               rtol=1e-6)


def kernel_inputs(x: np.ndarray, protected: list[int], k: int) -> dict:
    """One session's packed kernel inputs, as `triton_backend.select_packed` builds them (no eligibility mask)."""
    from gemkernels.select.backends.triton_backend import kernel_device

    device = kernel_device()
    n = x.shape[0]
    candidate = torch.ones(n, dtype=torch.int8, device=device)
    candidate[protected] = 0
    return dict(
        x=torch.from_numpy(x).to(device),
        inv_norm=torch.from_numpy((1 / np.linalg.norm(x.astype(np.float64), axis=1)).astype(np.float32)).to(device),
        offsets=torch.tensor([0, n], device=device),
        protected_idx=torch.tensor(protected + [0], dtype=torch.int32, device=device),
        protected_offsets=torch.tensor([0, len(protected)], device=device), candidate=candidate,
        tau=torch.ones(1, device=device), capacity=torch.tensor([k], dtype=torch.int32, device=device))


#: Row 1 lies 3e-20 off row 0: its exact residual, 9e-40, is a float32 denormal, which a GPU flushes to zero
#: (1/sqrt(0) = inf, then NaN); row 2 is independent.
DENORMAL_RESIDUAL = np.array([[1.0, 0.0], [1.0, 3e-20], [0.0, 1.0]], dtype=np.float32)


@pytest.mark.parametrize("greedy", ["stepwise", "exact"])
def test_a_denormal_residual_adds_no_direction_even_at_eps_0(greedy):
    """The explicit-basis greedies launched with eps = 0 (the backend never passes less than 8 machine epsilons,
    but the kernels must not divide by a residual that is not a positive normal number): protected row 1 adds no
    direction, so row 2 still has its whole residual and is selected third; dividing by sqrt(9e-40) made row 1 a
    direction along row 2, and the selection stopped at two rows."""
    from gemkernels.kernels.greedy_exact import greedy_exact
    from gemkernels.kernels.greedy_stepwise import greedy_stepwise

    inputs = kernel_inputs(DENORMAL_RESIDUAL, [0, 1], k=3)
    if greedy == "stepwise":
        indices, counts, coverage, residuals = greedy_stepwise(**inputs, lengths=np.array([3]), eps=0.0, width=3,
                                                               capacities=np.array([3]))
    else:
        out = (torch.full((1, 3), -1), torch.full((1,), -1), torch.empty(1), torch.empty(3))
        indices, counts, coverage, residuals = greedy_exact(
            *inputs.values(), eps=0.0, width=3, out=tuple(t.to(inputs["x"].device) for t in out))
    assert indices.tolist() == [[0, 1, 2]] and counts.tolist() == [3]
    assert torch.isfinite(residuals).all() and residuals.max().item() <= 1e-30
    assert coverage.item() == pytest.approx(1.0, abs=1e-7)


def test_stepwise_answers_do_not_depend_on_the_order_its_row_tiles_run(monkeypatch, triton_options):
    """The residual update's programs run in whatever order a GPU schedules them; the interpreter runs them in the
    plan's order, so shuffling the plan stands in for another schedule. Each tile stores its own residual sum in
    its own slot and the pivot kernel adds them in tile order: the same bits every time (an fp32 atomic sum per
    session rounded differently for different orders)."""
    from gemkernels.kernels import greedy_stepwise

    import gemkernels as gk
    from gemkernels.select.backends import triton_backend

    triton_options(triton_backend.TritonOptions(path="stepwise", block_n=16, block_d=16, pivot_block_d=16))
    rng = np.random.default_rng(23)
    xs = [rng.standard_normal((n, 24)).astype(np.float32) for n in (90, 7, 61)]
    batch = gk.RaggedBatch.from_list(xs, [[3], [], [0, 60]], None)
    plan = greedy_stepwise.row_tiles

    def shuffled(lengths, block_n):
        tile_session, tile_start, tile_offsets = plan(lengths, block_n)
        order = rng.permutation(len(tile_session))
        return tile_session[order], tile_start[order], tile_offsets

    runs = [gk.select_ragged(batch, tau=0.999, k=12, backend="triton")]
    monkeypatch.setattr(greedy_stepwise, "row_tiles", shuffled)
    runs += [gk.select_ragged(batch, tau=0.999, k=12, backend="triton") for _ in range(3)]
    for run in runs[1:]:
        for field in ("indices", "counts", "coverage", "residuals"):
            np.testing.assert_array_equal(getattr(run, field), getattr(runs[0], field), err_msg=field)
    # the coverage is that of the residuals returned, not of a running sum of their changes
    sums = np.add.reduceat(runs[0].residuals.astype(np.float64), batch.offsets[:-1])
    np.testing.assert_allclose(runs[0].coverage, 1 - sums / batch.lengths, atol=1e-6)
