"""The Triton kernels' building blocks on their own: the symmetric Gram plan and product, and the tile rules of
the register-resident greedy (the selections they produce are tested in tests/select/)."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")
pytest.importorskip("hypothesis")
from helpers import KernelSpy  # noqa: E402
from hypothesis import given  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from select_helpers import backend_marks  # noqa: E402

pytestmark = backend_marks("triton")


def test_gram_plan_lists_each_upper_tile_once():
    from gemkernels.kernels.gram import gram_plan

    lengths = np.array([1, 17, 40, 64, 3, 65])
    offsets, session, row, col = gram_plan(lengths, block_m=16)
    np.testing.assert_array_equal(offsets, np.concatenate([[0], np.cumsum(lengths ** 2)[:-1]]))
    for s, n in enumerate(lengths.tolist()):
        t = -(-n // 16)
        mine = sorted(zip(row[session == s].tolist(), col[session == s].tolist()))
        assert mine == [(i, j) for i in range(t) for j in range(i, t)], f"session {s}"
    assert np.all(np.diff(session) >= 0)  # sessions in order: one contiguous run each


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("block_k", [8, 16])
def test_ragged_gram_matches_float64_and_is_symmetric(dtype, block_k):
    """Every entry of every session's G_s = X_hat X_hat^T, with tiles smaller than the sessions and d (24: the
    unmasked K loop with BLOCK_K 8, the masked one with 16)."""
    from gemkernels.kernels.gram import ragged_gram

    from gemkernels.select.backends.triton_backend import kernel_device

    rng = np.random.default_rng(3)
    lengths = np.array([1, 17, 40, 33])
    d = 24
    x = rng.standard_normal((int(lengths.sum()), d)).astype(dtype)
    x[20] = 0.5 * x[18]  # a duplicate direction inside session 1
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    xt = torch.from_numpy(x).to(kernel_device())
    inv_norm = torch.from_numpy(1.0 / np.linalg.norm(x.astype(np.float64), axis=1)).float().to(kernel_device())
    gram, gram_offsets = ragged_gram(xt, inv_norm, torch.as_tensor(offsets, device=kernel_device()), lengths,
                                     block_m=16, block_k=block_k)
    gram, gram_offsets = gram.cpu().numpy(), gram_offsets.cpu().numpy()
    assert gram.shape == (int((lengths ** 2).sum()),)
    for s, n in enumerate(lengths.tolist()):
        rows = x[offsets[s]:offsets[s + 1]].astype(np.float64)
        unit = rows / np.linalg.norm(rows, axis=1, keepdims=True)
        got = gram[gram_offsets[s]:gram_offsets[s] + n * n].reshape(n, n)
        np.testing.assert_allclose(got, unit @ unit.T, atol=2e-6 if dtype == "float32" else 2e-5)
        np.testing.assert_array_equal(got, got.T)  # mirrored, not computed twice


def test_resident_tiles_cover_the_session_and_keep_registers_in_budget():
    from gemkernels.kernels.greedy_resident import SOURCES, resident_blocks, resident_fits

    for n_max in (1, 16, 17, 255, 256, 257, 1000, 1024):
        for width in (1, 15, 16, 33, 64, 128, 1000):
            for source in SOURCES:
                block_n, block_w, block_d, warps = resident_blocks(n_max, width, source)
                assert block_n >= n_max and block_w >= width
                assert all(v & (v - 1) == 0 for v in (block_n, block_w, block_d, warps))
                assert 4 <= warps <= 16
                if resident_fits(n_max, width, source):  # <= 32 projections a thread, 16 beside X
                    assert block_n * block_d <= 512 * warps  # <= 16 elements of an X tile a thread
                    assert block_n * block_w <= (16 if source == "x" else 32) * 32 * warps
                    assert source != "chip" or block_n * block_n <= 64 * 32 * warps  # <= 64 of G a thread


@pytest.mark.parametrize("n_max,width,source,fits", [
    (256, 16, "x", True), (257, 16, "x", False), (256, 32, "x", False), (64, 64, "x", True),
    (1024, 16, "gram", True), (1025, 1, "gram", False), (1024, 32, "gram", False), (128, 128, "gram", True),
    (256, 64, "gram", True), (256, 128, "gram", False), (1, 1, "x", True),
    (64, 64, "chip", True), (65, 1, "chip", False), (16, 16, "chip", True)])
def test_resident_limits(n_max, width, source, fits):
    """The sessions the resident greedy takes: up to 1,024 rows and 16,384 projections from G in memory, 256
    rows and 4,096 projections when each step also streams X, 64 rows with G on chip."""
    from gemkernels.kernels.greedy_resident import resident_fits

    assert resident_fits(n_max, width, source) == fits


@pytest.mark.parametrize("d", [24, 32, 40])
def test_gram_on_chip_matches_numpy(d, monkeypatch, triton_options):
    """Sessions of up to 64 rows compute G on chip, with the unmasked K loop (d = 32) and the masked one."""
    from gemkernels.kernels import greedy_resident

    import gemkernels as gk
    from gemkernels.select.backends import triton_backend

    launched = []
    monkeypatch.setattr(greedy_resident, "greedy_resident_kernel",
                        KernelSpy(greedy_resident.greedy_resident_kernel, "greedy_resident", launched))
    triton_options(triton_backend.TritonOptions(path="gram"))
    rng = np.random.default_rng(d)
    xs = [rng.standard_normal((n, d)).astype(np.float32) for n in (64, 1, 16, 33)]
    xs[0][40] = 3 * xs[0][7]  # a duplicate direction
    ps = [[7, 63], [0], [], [32]]
    sels = gk.select_batch(xs, protected=ps, tau=0.99, k=12, backend="triton")
    base = gk.select_batch(xs, protected=ps, tau=0.99, k=12, backend="numpy")
    assert [(c["SOURCE"], c["EVEN_D"]) for _, c in launched] == [("chip", d % 32 == 0)]
    for a, b in zip(sels, base):
        assert a.indices.tolist() == b.indices.tolist()
        np.testing.assert_allclose(a.residuals, b.residuals, atol=2e-6)
        assert a.coverage == pytest.approx(b.coverage, abs=1e-6)


def test_resident_greedy_refuses_sessions_it_cannot_hold():
    from gemkernels.kernels.greedy_resident import greedy_resident

    from gemkernels.select.backends.triton_backend import kernel_device

    x = torch.zeros(300, 8, device=kernel_device())
    with pytest.raises(ValueError, match="300 rows taking 16 steps"):
        greedy_resident(x, *[None] * 7, eps=1e-6, width=16, lengths=np.array([300]), source="x")
    with pytest.raises(ValueError, match="a Gram matrix exactly for 'gram'"):
        greedy_resident(x, *[None] * 7, eps=1e-6, width=16, lengths=np.array([30]), source="gram")


def test_warm_up_launches_one_variant_per_row_bucket(monkeypatch):
    """Sessions of 16, 32 and 64 rows in 24 dimensions, alone and in a batch of two: gram (G computed on chip) while
    n <= d, then passes over X; the register-resident greedy each time, with the row tile of that bucket and a step
    tile for k. Without a GPU nothing compiles ahead, so nothing runs."""
    from gemkernels.kernels import greedy_resident

    from gemkernels.select.api import warm_up
    from gemkernels.select.backends import triton_backend

    assert warm_up("triton", 24, k=5, max_rows=40) == []  # the interpreter compiles nothing
    monkeypatch.setattr(triton_backend, "compiles_ahead", lambda: True)
    launched = []
    monkeypatch.setattr(greedy_resident, "greedy_resident_kernel",
                        KernelSpy(greedy_resident.greedy_resident_kernel, "greedy_resident", launched))
    assert warm_up("triton", 24, k=5, max_rows=40) == [(16, 5), (32, 5), (64, 5)]
    assert [(c["BLOCK_N"], c["BLOCK_W"], c["SOURCE"]) for _, c in launched] == [
        (16, 8, "chip"), (16, 8, "chip"), (32, 8, "x"), (32, 8, "x"), (64, 8, "x"), (64, 8, "x")]
    assert [triton_backend.choose_path(np.array([n]), 24) for n in (16, 32, 64)] == ["gram", "fused", "fused"]
    launched.clear()
    assert warm_up("triton", 24, k=None, max_rows=16) == [(16, 16)]  # k = n: the step tile follows the rows
    assert [(c["BLOCK_N"], c["BLOCK_W"]) for _, c in launched] == [(16, 16)] * 2


@given(st.lists(st.integers(1, 40), min_size=1, max_size=30), st.integers(1, 8000))
def test_gram_groups_cover_the_batch_within_budget(lengths, budget):
    from gemkernels.select.backends.triton_backend import gram_groups

    groups = gram_groups(np.array(lengths), budget)
    assert groups[0][0] == 0 and groups[-1][1] == len(lengths)
    assert all(a < b for a, b in groups) and all(b == a2 for (_, b), (a2, _) in zip(groups, groups[1:]))
    for a, b in groups:
        used = 4 * sum(n * n for n in lengths[a:b])
        assert used <= budget or b == a + 1  # over the budget only as a session of its own
        if b < len(lengths):
            assert used + 4 * lengths[b] ** 2 > budget  # greedy: the next session would not have fitted


def test_gram_path_over_budget_runs_in_groups_with_the_same_answers(monkeypatch, triton_options):
    """A batch whose Gram matrices pass GRAM_MAX_BYTES: several launches, each session's answer the one it gets
    in a single launch (bit for bit when each group runs the same kernels)."""
    from gemkernels.kernels import gram

    import gemkernels as gk
    from gemkernels.select.backends import triton_backend

    rng = np.random.default_rng(5)
    lengths = (17, 3, 70, 1, 12)
    xs = [rng.standard_normal((n, 24)).astype(np.float32) for n in lengths]
    ps = [[0], [], [4, 19], [0], []]
    es = [None, None, np.arange(70) % 4 != 1, None, None]
    ks = np.array([6, 2, 9, 1, 3])  # groups of different widths: -1 padding where they are joined
    for resident in (False, True):  # 70 rows: G in memory, read by the global or the resident greedy
        triton_options(triton_backend.TritonOptions(path="gram", resident=resident))
        monkeypatch.setattr(triton_backend, "GRAM_MAX_BYTES", 2 << 30)
        whole = gk.select_ragged(gk.RaggedBatch.from_list(xs, ps, es), tau=0.95, k=ks, backend="triton")
        launches = []
        monkeypatch.setattr(gram, "gram_kernel", KernelSpy(gram.gram_kernel, "gram", launches))
        monkeypatch.setattr(triton_backend, "GRAM_MAX_BYTES", 4 * 20 * 20)
        grouped = gk.select_ragged(gk.RaggedBatch.from_list(xs, ps, es), tau=0.95, k=ks, backend="triton")
        monkeypatch.undo()
        assert len(triton_backend.gram_groups(np.array(lengths), 4 * 20 * 20)) == 3
        # every group builds G, or only the one past the 64 rows an on-chip G takes
        assert len(launches) == (1 if resident else 3)
        for field in ("indices", "counts", "coverage", "residuals"):
            if resident:  # the small groups computed G on chip: the same answers up to rounding
                np.testing.assert_allclose(getattr(whole, field), getattr(grouped, field), atol=2e-6, err_msg=field)
            else:  # the same kernels per session: bit for bit
                np.testing.assert_array_equal(getattr(whole, field), getattr(grouped, field), err_msg=field)
        assert (grouped.indices[1, 2:] == -1).all() and grouped.indices.shape[1] == 9


@pytest.mark.parametrize("path,resident", [("gram", True), ("gram", False), ("fused", True), ("fused", False)])
def test_cholesky_greedies_hand_back_exactly_the_near_dependent_sessions(path, resident, monkeypatch,
                                                                         triton_options):
    """A session whose pivot is near-dependent (a protected near-duplicate; the kernels' threshold is the backends')
    stops in the Cholesky greedy with count -1, and greedy_exact selects it again; the other sessions keep the
    Cholesky greedy's answer."""
    from gemkernels.kernels import greedy_exact, pivot

    import gemkernels as gk
    from gemkernels.select.backends import near_dependence, triton_backend

    triton_options(triton_backend.TritonOptions(path=path, resident=resident, block_n=16, block_d=16, block_w=4))
    handed = []
    exact = greedy_exact.greedy_exact

    def spy(*args, out, **kwargs):
        handed.append((out[1] < 0).tolist())
        return exact(*args, out=out, **kwargs)

    monkeypatch.setattr(greedy_exact, "greedy_exact", spy)
    assert pivot.NEAR_DEPENDENCE.value == pytest.approx(near_dependence(np.float32), rel=1e-6)
    rng = np.random.default_rng(7)
    xs = [rng.standard_normal((n, 24)).astype(np.float32) for n in (30, 40, 17)]
    xs[1][9] = xs[1][2] + 2e-3 * np.linalg.norm(xs[1][2]) * rng.standard_normal(24) / np.sqrt(24)
    ps = [[1], [2, 9], []]
    sels = gk.select_batch(xs, protected=ps, tau=0.95, k=6, backend="triton")
    base = gk.select_batch(xs, protected=ps, tau=0.95, k=6, backend="numpy")
    assert handed == [[False, True, False]]
    for a, b in zip(sels, base):
        assert a.indices.tolist() == b.indices.tolist()
        assert a.coverage == pytest.approx(b.coverage, abs=2e-6)
        np.testing.assert_allclose(a.residuals, b.residuals, atol=1e-5)


def test_exact_greedy_programs_stride_over_the_sessions(monkeypatch, triton_options):
    """Fewer exact-greedy programs than sessions: each takes every second session, with its own basis, and every
    handed-back session still gets its own answer."""
    from gemkernels.kernels import greedy_exact

    import gemkernels as gk
    from gemkernels.select.backends import triton_backend

    triton_options(triton_backend.TritonOptions(path="fused", block_n=16, block_d=16))
    monkeypatch.setattr(greedy_exact, "EXACT_PROGRAMS", 2)
    rng = np.random.default_rng(8)
    xs = [rng.standard_normal((n, 20)).astype(np.float32) for n in (21, 30, 18, 25, 40)]
    for s in (0, 2, 3, 4):  # a protected near-duplicate: handed back
        xs[s][5] = xs[s][1] * 2 + 1e-3 * rng.standard_normal(20).astype(np.float32)
    ps = [[1, 5]] * 5
    sels = gk.select_batch(xs, protected=ps, tau=0.97, k=7, backend="triton")
    base = gk.select_batch(xs, protected=ps, tau=0.97, k=7, backend="numpy")
    for a, b in zip(sels, base):
        assert a.indices.tolist() == b.indices.tolist()
        assert a.coverage == pytest.approx(b.coverage, abs=2e-6)
