"""The triton backend takes the rows' norms on the device (issue 18, item 7): from the Gram matrices' diagonals on the
gram path, from one pass over X on the others, with no pass of the API's own, and flags the rows it cannot
normalise, which the API reads once and refuses by name, as for every backend."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")
from helpers import KernelSpy  # noqa: E402
from select_helpers import backend_marks, check_selection, random_problem  # noqa: E402

import gemkernels as gk  # noqa: E402

pytestmark = backend_marks("triton")

#: (path, resident, session lengths), the norms' source: the gram path with G on chip (no norm kernel), with G in
#: memory read by the resident and by the global greedy (norms from G's diagonal), fused (resident and global:
#: from X) and stepwise.
PATHS = [("gram", True, (1, 33, 3, 17), None), ("gram", True, (1, 70, 3, 17), True),
         ("gram", False, (1, 33, 3, 17), True), ("fused", True, (1, 33, 3, 17), False),
         ("fused", False, (1, 33, 3, 17), False), ("stepwise", False, (1, 33, 3, 17), False)]
IDS = ["chip", "gram-resident", "gram-global", "fused-resident", "fused-global", "stepwise"]


@pytest.fixture
def forced(triton_options, monkeypatch):
    """Force a path (small tiles) and record the norm kernel's launches; the API must not take norms itself."""
    from gemkernels.kernels import norms

    from gemkernels.select import api
    from gemkernels.select.backends import triton_backend

    def no_pass(*args, **kwargs):
        raise AssertionError("the API took the rows' norms for the triton backend")

    monkeypatch.setattr(api, "row_sq_norms", no_pass)
    launched = []
    monkeypatch.setattr(norms, "row_norms_kernel", KernelSpy(norms.row_norms_kernel, "row_norms", launched))

    def force(path: str, resident: bool) -> list:
        triton_options(triton_backend.TritonOptions(path=path, resident=resident, block_n=16, block_d=16, block_w=4,
                                                    pivot_block_d=16, block_m=16, block_k=16))
        return launched
    return force


@pytest.mark.parametrize("path,resident,lengths,from_gram", PATHS, ids=IDS)
def test_norms_taken_on_the_device_give_the_reference_answers(forced, path, resident, lengths, from_gram):
    """Rows of norms from 0.5 to 4, fp32 and fp16: each answer holds against the float64 reference, and the norms
    came from where the path has them."""
    launched = forced(path, resident)
    rng = np.random.default_rng(23)
    for dtype in ("float32", "float16"):
        problems = [random_problem(rng, n, 24, max_k=12) for n in lengths]
        xs = [p[0].astype(dtype) for p in problems]
        sels = gk.select_batch(xs, protected=[p[1] for p in problems], eligible=[p[2] for p in problems],
                               tau=[p[3] for p in problems], k=[p[4] for p in problems], backend="triton")
        for (_, protected, eligible, tau, k), x, sel in zip(problems, xs, sels):
            check_selection(sel, x, protected, eligible, tau, k)
    assert [c["FROM_GRAM"] for _, c in launched] == ([] if from_gram is None else [from_gram] * 2)


BAD_VALUES = {"nan": (np.nan, "not finite"), "inf": (np.inf, "not finite"), "zero": (0.0, "all zeros"),
              "huge": (3e19, "too large or too small to normalise in float32"),
              "tiny": (1e-20, "too large or too small to normalise in float32")}  # 1/||x||^2 overflows fp32


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # the interpreter's numpy meets the NaN and inf
@pytest.mark.parametrize("path,resident,lengths,from_gram", PATHS, ids=IDS)
def test_a_bad_row_is_refused_by_name_on_every_path(forced, path, resident, lengths, from_gram):
    """A NaN, inf, zero or overflowing row, protected or not, in a session among good ones: the kernels run to their
    end (its session takes its protected steps only, so NaN cannot keep one looping) and the call raises the
    ValueError the numpy backend raises, naming the first bad row."""
    forced(path, resident)
    rng = np.random.default_rng(29)
    xs = [rng.standard_normal((n, 24)).astype(np.float32) for n in lengths]
    for i, (name, (value, problem)) in enumerate(BAD_VALUES.items()):
        bad = [x.copy() for x in xs]
        for row in (20, 5):
            if name in ("zero", "huge", "tiny"):
                bad[1][row] = value
            else:
                bad[1][row, 3] = value
        protected = [[0], [5, 7] if i % 2 else [], [], []]  # inf and huge: the bad row is a protected step
        with pytest.raises(ValueError, match=rf"^session 1 row 5 of the embeddings is {problem}"):
            gk.select_batch(bad, protected=protected, k=3, tau=0.99, backend="triton")


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
@pytest.mark.parametrize("path,resident,lengths,from_gram", PATHS, ids=IDS)
def test_the_good_sessions_of_a_batch_with_a_bad_one_are_answered(triton_options, path, resident, lengths,
                                                                  from_gram):
    """Under the API's error: the backend flags exactly the bad rows, and the other sessions get the answers they
    get alone (the bad session stops after its protected steps)."""
    from gemkernels.select.api import session_capacity
    from gemkernels.select.backends import triton_backend

    triton_options(triton_backend.TritonOptions(path=path, resident=resident, block_n=16, block_d=16, block_w=4,
                                                pivot_block_d=16, block_m=16, block_k=16))
    rng = np.random.default_rng(31)
    xs = [rng.standard_normal((n, 24)).astype(np.float32) for n in lengths]
    xs[1][[4, 9]] = np.inf
    batch = gk.RaggedBatch.from_list([torch.from_numpy(x) for x in xs], [[0], [2], [], [1]], None)
    capacity = session_capacity(np.full(4, 6), batch.protected_counts, batch.lengths)
    packed = triton_backend.select_packed(batch, batch.values, None, np.full(4, 0.99), capacity, 1e-6)
    flags = np.zeros(batch.values.shape[0], dtype=np.int8)
    flags[[lengths[0] + 4, lengths[0] + 9]] = 1
    np.testing.assert_array_equal(packed.bad_rows.numpy() != 0, flags != 0)
    assert int(packed.counts[1]) in (0, 1)  # the protected step only (or none, on chip)
    for s in (0, 2, 3):
        alone = gk.select(xs[s], protected=[[0], [2], [], [1]][s], k=6, tau=0.99, backend="numpy")
        assert packed.indices[s, :int(packed.counts[s])].tolist() == alone.indices.tolist(), s


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_float64_rows_whose_fp32_norm_overflows_are_refused():
    """triton reads float64 rows as fp32: a row of 1e30s is finite in float64, but its fp32 squared norm is inf.
    The API's float64 norms let it through, and the kernels gave zero scales and a silent wrong answer; now it is
    refused by name."""
    x = np.random.default_rng(37).standard_normal((12, 24))
    x[7] *= 1e30
    assert np.isfinite((x ** 2).sum(axis=1)).all()
    with pytest.raises(ValueError, match=r"^row 7 of the embeddings is too large or too small to normalise in float32"):
        gk.select(torch.from_numpy(x), k=4, backend="triton")
    assert len(gk.select(x, k=4, backend="numpy").indices) == 4  # float64 on the CPU: fine
