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
from select_helpers import HAS_CUDA, backend_marks  # noqa: E402

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
    """Every entry of every session's G_s = X_s X_s^T (not normalised: its diagonal holds the squared norms), with tiles
    smaller than the sessions and d (24: the unmasked K loop with BLOCK_K 8, the masked one with 16)."""
    from gemkernels.kernels.gram import ragged_gram

    from gemkernels.select.backends.triton_backend import kernel_device

    if block_k < 16 and HAS_CUDA:
        pytest.skip("tl.dot takes K >= 16 when compiled; BLOCK_K 8 runs in the interpreter only")
    rng = np.random.default_rng(3)
    lengths = np.array([1, 17, 40, 33])
    d = 24
    x = rng.standard_normal((int(lengths.sum()), d)).astype(dtype)
    x[20] = 0.5 * x[18]  # a duplicate direction inside session 1
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    xt = torch.from_numpy(x).to(kernel_device())
    gram, gram_offsets = ragged_gram(xt, torch.as_tensor(offsets, device=kernel_device()), lengths, block_m=16,
                                     block_k=block_k)
    gram, gram_offsets = gram.cpu().numpy(), gram_offsets.cpu().numpy()
    assert gram.shape == (int((lengths ** 2).sum()),)
    for s, n in enumerate(lengths.tolist()):
        rows = x[offsets[s]:offsets[s + 1]].astype(np.float64)
        got = gram[gram_offsets[s]:gram_offsets[s] + n * n].reshape(n, n)
        np.testing.assert_allclose(got, rows @ rows.T, rtol=1e-5 if dtype == "float32" else 1e-3, atol=1e-4)
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
    assert [(c["SOURCE"], c["EVEN_D"]) for _, c in launched] == [("chip", d % 16 == 0)]
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


def test_fused_greedy_refuses_coordinates_past_int32():
    """A session whose capacity x rows reaches 2^31 would wrap the fused greedy's int32 offsets inside its C."""
    from gemkernels.kernels.greedy_fused import greedy_fused

    from gemkernels.select.backends.triton_backend import kernel_device

    x = torch.zeros(4, 8, device=kernel_device())
    with pytest.raises(ValueError, match="capacity x rows < 2\\^31.*path='stepwise'"):
        greedy_fused(x, *[torch.zeros(2, device=kernel_device())] * 7, eps=1e-6, width=16,
                     lengths=np.array([3, 2 ** 27]), capacities=np.array([3, 16]))


#: (S, n, d, itemsize): the path `choose_path` takes, and the fused and stepwise estimates by hand.
HEADLINE_RULES = [((4096, 256, 1024, 2), "gram"), ((256, 4096, 384, 2), "stepwise"), ((256, 4096, 384, 4), "stepwise"),
                  ((1024, 256, 1024, 4), "gram"), ((2048, 2048, 384, 2), "gram"), ((2048, 2048, 384, 4), "stepwise"),
                  ((16, 8192, 384, 2), "stepwise"), ((4096, 64, 1024, 2), "gram")]


@pytest.mark.parametrize("shape,path", HEADLINE_RULES)
def test_shape_rule_follows_bytes_and_occupancy(shape, path):
    """The paths `choose_path` takes at the headline and neighbouring shapes (b = 16; DESIGN.md §1.1's table), and
    the estimates it takes them from, worked out here by hand: fused and stepwise both make 16 passes over X (and
    one for the norms, one launch), but
    fused runs one program a session, and 256 sessions keep 256 / (4 x 132) of an H100's HBM stream busy (S=256,
    n=4096, d=384 went to fused: about 7 ms against 3.4); gram moves X once and G (4 n^2 a session), fewer bytes
    than 16 passes in bf16 up to n = 7.5 d, but its fp32 product runs on CUDA cores."""
    from gemkernels.select.backends import triton_backend as tb

    sessions, n, d, itemsize = shape
    lengths = np.full(sessions, n)
    costs = tb.path_costs(lengths, d, itemsize, steps=16)
    assert tb.choose_path(lengths, d, itemsize, steps=16) == path
    passes = (16 + 1) * sessions * n * d * itemsize
    coords = 2 * 16 ** 2 * sessions * n if n > 256 else 0
    fill = tb.PROGRAMS_PER_SM * tb.DEFAULT_SMS
    fused = (passes + coords) / (tb.HBM_BYTES_PER_S * min(1, sessions / fill)) + 3 * tb.LAUNCH_S
    tiles = sessions * -(-n // 128)
    stepwise = passes / (tb.HBM_BYTES_PER_S * min(1, tiles / fill)) + 34 * tb.LAUNCH_S
    assert costs["fused"].seconds == pytest.approx(fused) and costs["stepwise"].seconds == pytest.approx(stepwise)
    assert costs["stepwise"].launches == 34 and costs["fused"].launches == 3
    assert costs[path].seconds == min(c.seconds for c in costs.values())


def test_shape_rule_leaves_out_what_a_batch_cannot_take():
    """No gram path for a session whose own G passes GRAM_MAX_BYTES or whose n x d passes int32 offsets; fused only
    once its sessions fill the GPU, where it saves stepwise's 2b launches."""
    from gemkernels.select.backends import triton_backend as tb

    assert "gram" not in tb.path_costs(np.array([25_000]), 16)  # 4 n^2 = 2.5 GB
    assert "gram" not in tb.path_costs(np.array([2 ** 21]), 1024)
    assert "fused" not in tb.path_costs(np.array([2 ** 27]), 16, steps=16)  # b x n = 2^31: int32 offsets in C
    assert "fused" in tb.path_costs(np.array([2 ** 27 - 1]), 16, steps=16)
    few, many = np.full(8, 200), np.full(20_000, 200)
    assert tb.path_costs(few, 4096, 2)["stepwise"].seconds < tb.path_costs(few, 4096, 2)["fused"].seconds
    assert tb.path_costs(many, 4096, 2)["fused"].seconds < tb.path_costs(many, 4096, 2)["stepwise"].seconds


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


@pytest.mark.parametrize("path", ["fused", "stepwise"])
def test_scratch_is_sized_by_each_sessions_capacity(path, monkeypatch, triton_options):
    """The global greedy's coordinates C and the stepwise bases take capacity_s x n_s (x d) values a session, not the
    widest session's capacity times every row: here one session of 60 rows protects 12 and caps the width at 12,
    the other sessions take 3 steps each (or fewer rows). The answers stay those of the numpy backend."""
    from gemkernels.kernels import greedy_fused, greedy_stepwise

    import gemkernels as gk
    from gemkernels.select.backends import triton_backend

    triton_options(triton_backend.TritonOptions(path=path, resident=False, block_n=16, block_d=16, block_w=4,
                                                pivot_block_d=16))
    module = greedy_fused if path == "fused" else greedy_stepwise
    sizes = []
    blocks = module.session_blocks

    def spy(capacities, per_session):
        sizes.append((np.asarray(capacities).tolist(), np.broadcast_to(per_session, len(capacities)).tolist()))
        return blocks(capacities, per_session)

    monkeypatch.setattr(module, "session_blocks", spy)
    rng = np.random.default_rng(31)
    lengths = (60, 2, 300, 45)
    xs = [rng.standard_normal((n, 20)).astype(np.float32) for n in lengths]
    ps = [list(range(0, 60, 5)), [], [7], [1]]
    sels = gk.select_batch(xs, protected=ps, tau=1.0, k=3, backend="triton")
    base = gk.select_batch(xs, protected=ps, tau=1.0, k=3, backend="numpy")
    for a, b in zip(sels, base):
        assert a.indices.tolist() == b.indices.tolist()
        assert a.coverage == pytest.approx(b.coverage, abs=2e-6)
    assert sizes == [([12, 2, 3, 3], list(lengths) if path == "fused" else [20] * 4)]
    per_session = np.array(sizes[0][0]) * np.array(sizes[0][1])
    assert per_session.sum() < 0.5 * 12 * np.array(lengths if path == "fused" else [20] * 4).sum()  # width 12


@given(st.lists(st.tuples(st.sampled_from(["int64", "int32", "int8", "float32"]), st.integers(0, 37)), max_size=8),
       st.integers(0, 2 ** 32 - 1))
def test_upload_keeps_every_array_in_one_aligned_buffer(specs, seed):
    """The per-call host arrays reach the device as they were (dtype, shape, values), each at a 16-byte boundary of
    one buffer (one copy), none overlapping another."""
    from gemkernels.kernels.launch import upload

    from gemkernels.select.backends.triton_backend import kernel_device

    rng = np.random.default_rng(seed)
    arrays = [(rng.standard_normal(size) * 100).astype(dtype) for dtype, size in specs]
    tensors = upload(kernel_device(), *arrays)
    assert len(tensors) == len(arrays)
    for a, t in zip(arrays, tensors):
        assert t.device.type == kernel_device().type and str(t.dtype) == f"torch.{a.dtype}"
        np.testing.assert_array_equal(t.cpu().numpy(), a)
        assert t.data_ptr() % 16 == 0
    if tensors:
        assert len({t.untyped_storage().data_ptr() for t in tensors}) == 1
    for t in tensors:  # writable, and no view reaches into another's bytes
        t.fill_(0)
    for a, t in zip(arrays, tensors):
        assert not t.any(), a


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA device")
@pytest.mark.parametrize("path", ["gram", "fused", "stepwise"])
def test_a_call_can_be_captured_in_a_cuda_graph(path, triton_options):
    """The backend's work for one batch makes no blocking copy and no stream synchronisation (its host arrays go up
    in one pinned, non-blocking copy), so it can be captured in a CUDA graph; replayed, the graph gives the answer
    of a call made outside it."""
    import gemkernels as gk
    from gemkernels.select.api import session_capacity
    from gemkernels.select.backends import triton_backend

    triton_options(triton_backend.TritonOptions(path=path))
    rng = np.random.default_rng(41)
    xs = [torch.from_numpy(rng.standard_normal((n, 128)).astype(np.float32)).cuda() for n in (40, 300, 7)]
    batch = gk.RaggedBatch.from_list(xs, [[0], [5], []], None)
    values = batch.values
    sq_norms = None  # the kernels take them, as for the API, with the bad-row flags left on the device
    tau, capacity = np.full(3, 0.95), session_capacity(np.full(3, 8), batch.protected_counts, batch.lengths)
    expected = triton_backend.select_packed(batch, values, sq_norms, tau, capacity, 1e-6)  # compiles, warm
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        triton_backend.select_packed(batch, values, sq_norms, tau, capacity, 1e-6)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = triton_backend.select_packed(batch, values, sq_norms, tau, capacity, 1e-6)
    graph.replay()
    torch.cuda.synchronize()
    for field in ("indices", "counts", "coverage", "residuals", "bad_rows"):
        torch.testing.assert_close(getattr(captured, field), getattr(expected, field), rtol=0, atol=0)


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA or torch.cuda.device_count() < 2, reason="needs two CUDA devices")
def test_kernels_launch_on_the_rows_device():
    """Rows on cuda:1 while cuda:0 is current: the kernels run where the rows are, and so do the results."""
    import gemkernels as gk

    x = torch.from_numpy(np.random.default_rng(42).standard_normal((300, 64)).astype(np.float32))
    base = gk.select(x.numpy(), protected=[0], k=8, backend="numpy")
    with torch.cuda.device(0):
        sel = gk.select(x.to("cuda:1"), protected=[0], k=8, backend="triton")
    assert sel.indices.device == torch.device("cuda:1")
    assert sel.indices.tolist() == base.indices.tolist()
