"""The keep/ready router and the rules beside it: superseded blocks, live references, lexicons, the ranked order,
the listwise fit against an independent optimiser, the shipped file, and GEM with every ranking."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import numpy as np
import pytest

pytest.importorskip("hypothesis")
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from gemkernels import GEM  # noqa: E402
from gemkernels.compress.blocks import Action, Block, parse_history  # noqa: E402
from gemkernels.compress.config import resolve_config, with_overrides  # noqa: E402
from gemkernels.compress.encoders import CachedEncoder, HashEncoder  # noqa: E402
from gemkernels.compress.evidence import block_features  # noqa: E402
from gemkernels.compress.evidence.rules import reference_blocks  # noqa: E402
from gemkernels.compress.gem import warn_encoder_mismatch  # noqa: E402
from gemkernels.compress.references import (  # noqa: E402
    IDENTIFIER,
    NUMBER,
    PATH,
    HeldIndex,
    Lexicon,
    block_lexicon,
    hashed,
    held_tokens,
    references,
    split_paths,
)
from gemkernels.compress.representation import block_text  # noqa: E402
from gemkernels.compress.router import FEATURES, Router, call_signature, default_router, request_features  # noqa: E402
from gemkernels.compress.router.features import live_references, rank_signals, superseded  # noqa: E402
from gemkernels.compress.router.model import FORMAT_VERSION  # noqa: E402
from gemkernels.compress.router.ranking import retrieval_scores, router_order  # noqa: E402


def bash(command: str, output: str = "") -> Block:
    """A one-call block running ``command``."""
    return Block((0, 1), ("c",), "", "", (Action("bash", json.dumps({"command": command})),), (output,))


def lexicons(blocks) -> list[Lexicon]:
    return [block_lexicon(b, block_text(b)) for b in blocks]


# --------------------------------------------------------------------------- superseded

def test_a_re_read_file_and_a_re_run_command_supersede_the_older_blocks():
    blocks = [bash("cat src/app/models.py", "class User: ..."), bash("sed -i 's/a/b/' src/app/models.py"),
              bash("python -m pytest tests/test_models.py", "1 failed"), bash("cat src/app/models.py", "class User"),
              bash("python -m pytest tests/test_models.py", "1 passed"), bash("ls src/app")]
    assert superseded([call_signature(b) for b in blocks]).tolist() == [True, False, True, False, False, False]


def test_other_reads_of_the_same_file_and_blocks_without_calls_supersede_nothing():
    """Different lines of one file, a grep then a cat: the newer read does not replace the older one."""
    blocks = [bash("sed -n 1,40p a/x.py"), bash("sed -n 200,260p a/x.py"), bash("grep -n foo a/x.py"),
              bash("cat a/x.py"), Block((0, 1), ("c",), "", "thinking", (), ()), Block((0, 1), ("d",), "", "", (), ())]
    assert all(block_features(b).sources for b in blocks[:4])  # all four read the same source
    assert not superseded([call_signature(b) for b in blocks]).any()


@settings(max_examples=150, deadline=None)
@given(st.lists(st.integers(0, 4), max_size=25))
def test_superseded_is_a_newer_block_with_the_same_calls(signatures):
    expected = [bool(signatures[i]) and signatures[i] in signatures[i + 1:] for i in range(len(signatures))]
    assert superseded(signatures).tolist() == expected


# --------------------------------------------------------------------------- lexicons and live references

def test_a_block_holds_the_paths_and_identifiers_an_action_names():
    holder = bash("grep -rn validate_username .", "django/contrib/auth/validators.py:12: def validate_username()")
    later = bash("sed -n 1,40p django/contrib/auth/validators.py")
    assert np.isin(block_lexicon(later, block_text(later)).names, block_lexicon(holder, block_text(holder)).holds).any()
    unrelated = bash("ls docs", "index.rst")
    assert not np.isin(block_lexicon(later, block_text(later)).names,
                       block_lexicon(unrelated, block_text(unrelated)).holds).any()


@settings(max_examples=60, deadline=None)
@given(st.lists(st.from_regex(r"[a-z][a-z0-9_]{4,12}", fullmatch=True), min_size=1, max_size=6),
       st.lists(st.from_regex(r"[a-z]{2,6}/[a-z]{2,6}\.py", fullmatch=True), max_size=3))
def test_what_an_action_names_in_a_text_that_text_holds(words, paths):
    """Every reference token `references` reads from a text (identifiers, path tails) is among its held tokens."""
    text = " ".join(words + paths)
    named = references(text)
    held = held_tokens(text)
    assert named.words <= held and named.strings <= held
    assert set(hashed(named.words | named.strings).tolist()) <= set(hashed(held).tolist())


def test_live_references_count_the_last_actions_that_name_a_block_and_their_specificity():
    blocks = [bash("cat core/parser.py", "def parse_tokens(): ..."),  # holds parser.py, parse_tokens
              bash("cat core/lexer.py", "def lex(): parse_tokens()"),  # holds lexer.py, parse_tokens
              bash("ls", "README"),
              bash("grep -n parse_tokens core/parser.py"),  # names parse_tokens (2 holders), parser.py (1 holder)
              bash("python -c 'import core.lexer'")]
    live = live_references(lexicons(blocks), window=2)
    # the last two actions are blocks 3 and 4; block 3 names parse_tokens and core/parser.py, block 4 names nothing
    # that another block holds except the quoted literal, which no block holds
    assert live[:, 0].tolist() == [1, 1, 0, 0, 0]
    assert live[:, 1].tolist() == [0, 0, 0, 0, 0]  # the latest action (block 4) names none of them
    parse_tokens_share = 1 / 2
    assert live[0, 2] > live[1, 2] >= parse_tokens_share - 1e-12  # block 0 also holds the path, named once


def live_references_by_loops(lexicons: list[Lexicon], window: int) -> np.ndarray:
    """`live_references` read literally: for each of the last ``window`` actions, each other block that holds a name
    it names counts once, and each such name adds 1 / (the other blocks holding it), in the name's order."""
    n = len(lexicons)
    out = np.zeros((n, 3))
    if n < 2:
        return out
    holds = [set(lex.holds.tolist()) for lex in lexicons]
    for j in range(max(0, n - window), n):
        named = set(lexicons[j].names.tolist())
        for b in range(n):
            shared = sorted(named & holds[b]) if b != j else []
            for token in shared:
                out[b, 2] += 1.0 / sum(token in holds[i] for i in range(n) if i != j)
            if shared:
                out[b, 0] += 1
                out[b, 1] = 1 if j == n - 1 else out[b, 1]
    return out


token_sets = st.lists(st.integers(-3, 12), max_size=8).map(lambda xs: np.unique(np.asarray(xs, dtype=np.int64)))


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(token_sets, token_sets), max_size=12), st.integers(0, 12), st.integers(1, 5))
def test_live_references_from_a_grown_held_index_equal_the_definition_bit_for_bit(pairs, split, window):
    """Small token alphabets, so that many blocks hold the same tokens; the index grown in two steps (a session's)
    and built at once give the same bits as the definition."""
    lexs = [Lexicon(holds, names) for holds, names in pairs]
    split = min(split, len(lexs))
    grown = HeldIndex.of(lexs[:split]).extended(lexs[split:])
    whole = HeldIndex.of(lexs)
    assert grown.blocks == whole.blocks == len(lexs)
    assert grown.values.tolist() == whole.values.tolist() and grown.owners.tolist() == whole.owners.tolist()
    expected = live_references_by_loops(lexs, window)
    assert live_references(lexs, window, held=grown).tobytes() == expected.tobytes()
    assert live_references(lexs, window).tobytes() == expected.tobytes()


def test_a_held_index_of_other_blocks_is_refused():
    lexs = lexicons([bash("cat a/b.py", "x"), bash("ls", "a/b.py")])
    with pytest.raises(ValueError, match="held index has 1 blocks"):
        live_references(lexs, held=HeldIndex.of(lexs[:1]))


path_like = st.lists(st.sampled_from(list("ab_./-:é \n1") + ["x.py", "src/", "../", "'q'", "http://", ".md", "-"]),
                     max_size=30).map("".join)


@settings(max_examples=400)
@given(path_like)
def test_split_paths_is_the_path_regex_s_matches_and_its_substitution(text):
    assert split_paths(text) == ([m.group(0) for m in PATH.finditer(text)], PATH.sub(" ", text))


word_like = st.lists(st.sampled_from(list("aZ_09.é-x \n$") + ["ab", "123", "4567", "_x1", "a.1", "1.234"]),
                     max_size=30).map("".join)


@settings(max_examples=400)
@given(word_like)
def test_identifier_and_number_patterns_match_as_their_plain_forms(text):
    """The patterns reordered for speed find what they say: words with a boundary before and after, digit runs not
    after a word character or a dot."""
    assert [m.span() for m in IDENTIFIER.finditer(text)] == [
        m.span() for m in re.finditer(r"\b[A-Za-z_][A-Za-z0-9_]{3,}\b", text)]
    assert [m.span() for m in NUMBER.finditer(text)] == [m.span() for m in re.finditer(r"(?<![\w.])\d{3,}(?!\d)", text)]


@given(st.sets(st.text(max_size=6), max_size=40))
def test_hashed_is_the_sorted_unique_hashes(tokens):
    assert hashed(tokens).tolist() == sorted({hash(t) for t in tokens})
    assert hashed(tokens).dtype == np.int64


def test_a_block_is_not_its_own_live_reference():
    blocks = [bash("ls", "x"), bash("cat util/helpers.py", "util/helpers.py: def helper_function()")]
    assert live_references(lexicons(blocks))[1].tolist() == [0, 0, 0]


def test_the_reference_rule_keeps_the_latest_older_block_that_defines_what_recent_actions_name():
    blocks = [bash("cat pkg/settings.py", "DEBUG = True"), bash("ls"), bash("cat pkg/settings.py", "DEBUG = False"),
              bash("echo hi", "hi"), bash("python -c 'from pkg import settings'"), bash("sed -n 1p pkg/settings.py")]
    assert reference_blocks(lexicons(blocks), window=1, count=2) == [2]
    # the last three are the naming actions themselves: the holder is looked for before them
    assert reference_blocks(lexicons(blocks), window=3, count=2) == [2]
    assert reference_blocks(lexicons(blocks), window=4, count=2) == [0]  # block 2 is inside the window now
    assert reference_blocks(lexicons(blocks), window=3, count=0) == []
    assert reference_blocks(None, window=3, count=2) == []
    newer_only = [bash("ls"), bash("grep -n needle mod/a.py"), bash("cat mod/a.py", "needle here")]
    assert reference_blocks(lexicons(newer_only), window=2, count=2) == []  # only a newer block holds it


def test_gem_protects_a_referenced_block_under_the_reference_rule():
    messages = history_of([("cat", f"cat mod/file_{i}.py", f"content {i}") for i in range(20)]
                          + [("grep", "grep -n needle mod/file_3.py", "12: needle")])
    gem = GEM(with_overrides("core", ["evidence.reference=1", "evidence.recent=2", "k=4"]), encoder=HashEncoder(64),
              token_counter=None)
    out = gem.compress(messages, session_id="s")
    assert out.stats.protected["reference"] == [3]
    assert 3 not in out.stats.removed_blocks and len(out.stats.removed_blocks) >= 10


# --------------------------------------------------------------------------- signals, ranks, order

def test_rank_signals_are_the_top3_top8_and_log_rank_with_newer_first_on_ties():
    values = np.array([0.5, 0.9, 0.9, 0.1, 0.3])
    out = rank_signals(values)
    ranks = np.array([2, 1, 0, 4, 3])  # the two 0.9s: the newer (index 2) first
    assert out[:, 0].tolist() == (ranks < 3).tolist() and out[:, 1].tolist() == [1] * 5
    assert np.allclose(out[:, 2], np.log1p(ranks))


def test_request_features_have_one_column_per_named_signal_and_do_not_depend_on_encoder_scale():
    blocks = [bash(f"cat f{i}.py", "x" * (10 * i)) for i in range(12)]
    x = np.random.default_rng(0).normal(size=(12, 16))
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    args = (lexicons(blocks), [call_signature(b) for b in blocks], [block_features(b) for b in blocks],
            [5 + i for i in range(12)])
    signals = request_features(*args, x, x[0])
    assert signals.shape == (12, len(FEATURES)) and np.isfinite(signals).all()
    age = signals[:, [FEATURES.index(f) for f in FEATURES if f.startswith("age")]]
    assert (age.sum(axis=1) == 1).all()
    assert signals[-1, FEATURES.index("age<1")] == 1 and signals[0, FEATURES.index("age<13")] == 1  # ages 0, 11
    ranked = [FEATURES.index(f) for f in FEATURES if f.endswith(("_top3", "_top8", "_log_rank")) or f.startswith("z_")]
    scaled = request_features(*args, x * 3.0, x[0] * 3.0)  # an encoder of another scale: cosines 9 times larger
    assert np.allclose(scaled[:, ranked], signals[:, ranked]) and not np.allclose(scaled, signals)


@settings(max_examples=80, deadline=None)
@given(st.data())
def test_router_order_is_the_seeds_then_every_eligible_block_by_density(data):
    n = data.draw(st.integers(1, 30))
    scores = np.array(data.draw(st.lists(st.floats(0, 1), min_size=n, max_size=n)))
    tokens = data.draw(st.lists(st.integers(1, 1000), min_size=n, max_size=n))
    seeds = data.draw(st.lists(st.integers(0, n - 1), max_size=n))
    eligible = np.array(data.draw(st.lists(st.booleans(), min_size=n, max_size=n)))
    power = data.draw(st.sampled_from([0.0, 0.5, 1.0]))
    order = router_order(scores, tokens, seeds, eligible, power)
    protected = sorted(set(seeds))
    assert order[:len(protected)] == protected
    rest = order[len(protected):]
    assert set(rest) == {b for b in range(n) if eligible[b] and b not in protected} and len(rest) == len(set(rest))
    density = [scores[b] / tokens[b] ** power for b in rest]
    assert all(a >= b for a, b in zip(density, density[1:]))


def test_retrieval_scores_are_the_largest_cosine_to_the_last_three_blocks():
    x = np.random.default_rng(1).normal(size=(9, 8))
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    expected = [max(float(x[i] @ x[j]) for j in (6, 7, 8)) for i in range(9)]
    assert np.allclose(retrieval_scores(x), expected)


# --------------------------------------------------------------------------- the model and its file

def test_the_shipped_router_loads_offline_with_numpy_only_and_its_shares_sum_to_one():
    code = ("import sys; from gemkernels.compress.router import default_router; r = default_router(); "
            "assert not {'torch', 'scipy', 'sklearn', 'httpx'} & set(sys.modules), sorted(sys.modules); "
            "print(sorted(r.heads))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "['referenced', 'top3']"
    router = default_router()
    assert router.meta["encoder"] and router.meta["runs_per_family"]
    signals = np.random.default_rng(2).normal(size=(25, len(FEATURES)))
    shares = router.shares(signals)
    assert all(abs(s.sum() - 1) < 1e-12 and (s > 0).all() for s in shares.values())
    assert np.allclose(router.scores(signals), shares["top3"] + shares["referenced"])


def test_a_router_file_round_trips_and_a_file_for_other_signals_names_the_fix(tmp_path):
    rng = np.random.default_rng(3)
    router = Router({"top3": rng.normal(size=len(FEATURES)), "referenced": rng.normal(size=len(FEATURES))},
                    {"seed": 7})
    router.save(tmp_path / "r.json")
    back = Router.load(tmp_path / "r.json")
    assert back.meta == {"seed": 7}
    assert all(np.allclose(back.heads[h], router.heads[h], atol=1e-8) for h in router.heads)
    data = json.loads((tmp_path / "r.json").read_text())
    data["features"] = data["features"][:-1]
    (tmp_path / "old.json").write_text(json.dumps(data))
    with pytest.raises(ValueError, match="gem train-router"):
        Router.load(tmp_path / "old.json")
    assert data["format"] == FORMAT_VERSION


def test_gem_refuses_a_missing_or_stale_router_file_when_it_is_built(tmp_path, caplog):
    with pytest.raises(ValueError, match="nowhere.json"):
        GEM(with_overrides("cache-aware", [f"router={tmp_path / 'nowhere.json'}"]), encoder=HashEncoder(64))
    (tmp_path / "short.json").write_text(json.dumps({"format": FORMAT_VERSION, "features": list(FEATURES),
                                                     "heads": {"top3": [0.0] * 3}}))
    with pytest.raises(ValueError, match=f"{len(FEATURES)} weights"):
        GEM(with_overrides("cache-aware", [f"router={tmp_path / 'short.json'}"]), encoder=HashEncoder(64))
    warn_encoder_mismatch.cache_clear()
    with caplog.at_level("WARNING", logger="gemkernels"):
        GEM("cache-aware", encoder=HashEncoder(64))  # the shipped router was trained with minilm
        GEM("cache-aware", encoder=HashEncoder(64))
    assert caplog.text.count("trained with encoder") == 1  # once per process, not once per GEM
    caplog.clear()
    with caplog.at_level("WARNING", logger="gemkernels"):
        GEM("paper", encoder=HashEncoder(64))  # no router: nothing to say
    assert not caplog.text


# --------------------------------------------------------------------------- GEM with every ranking

VARIANTS = {
    "router": ("cache-aware", ()),
    "geometry": ("cache-aware-geometry", ()),
    "retrieval": ("cache-aware", ("ranking=retrieval",)),
    "superseded": ("cache-aware", ("drop_superseded=True",)),
    "paper-router": ("paper", ("ranking=router",)),
    "core-superseded": ("core", ("drop_superseded=True", "evidence.reference=2")),
}


def history_of(steps):
    """An OpenAI history: system, task, then one bash call and its result per (name, command, output)."""
    messages = [{"role": "system", "content": "You are a coding agent."},
                {"role": "user", "content": "Fix the failing parser test."}]
    for i, (_, command, output) in enumerate(steps):
        messages.append({"role": "assistant", "content": None, "tool_calls": [{
            "id": f"call_{i}", "type": "function",
            "function": {"name": "bash", "arguments": json.dumps({"command": command})}}]})
        messages.append({"role": "tool", "tool_call_id": f"call_{i}", "content": output})
    return messages


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_every_ranking_keeps_whole_blocks_in_order_and_its_rewrite_fits_the_budget(variant):
    preset, overrides = VARIANTS[variant]
    config = with_overrides(preset, [*overrides, "repay_factor=None", "rewrite_above_blocks=30"]
                            if preset.startswith("cache-aware") else overrides)
    rng = np.random.default_rng(4)
    steps = [("bash", f"cat src/mod_{i % 7}.py" if i % 3 else f"python -m pytest tests/t_{i % 5}.py",
              "x" * int(rng.integers(20, 2000))) for i in range(45)]
    messages = history_of(steps)
    snapshot = json.dumps(messages)
    gem = GEM(config, encoder=CachedEncoder(HashEncoder(64)), token_counter=None)
    rewrote = False
    for end in range(2 + 2 * 16, len(messages) + 1, 2):
        request = messages[:end]
        out = gem.compress(request, session_id="s")
        history = parse_history(request)
        ids = {id(m) for m in out.messages}
        kept = [b for b, span in enumerate(history.spans) if {id(request[p]) for p in span.positions} <= ids]
        assert all(id(request[p]) not in ids for b, span in enumerate(history.spans) if b not in kept
                   for p in span.positions), f"{variant}: a block was split"
        parse_history(out.messages)
        positions = [i for i, m in enumerate(request) if id(m) in ids]
        assert len(positions) == len(out.messages) and positions == sorted(positions)
        n = len(history.spans)
        assert set(range(n - config.evidence.recent, n)) <= set(kept)
        if out.stats.action == "reselected" and config.keep_recent_size:
            rewrote = True
            sizes = [-(-sum(len(json.dumps(request[p])) + 2 for p in span.positions) // 4) for span in history.spans]
            protected = {b for picks in out.stats.protected.values() for b in picks}
            budget = sum(sizes[-config.k:])
            assert sum(sizes[b] for b in kept if b not in protected) <= budget - sum(sizes[b] for b in protected)
    assert json.dumps(messages) == snapshot
    assert rewrote or not config.keep_recent_size


def test_drop_superseded_never_completes_with_a_superseded_block():
    steps = [("bash", "cat app/views.py", f"version {i} " + "y" * 300) for i in range(10)]
    steps += [("bash", f"ls dir_{i}", "z" * 50) for i in range(12)]
    messages = history_of(steps)
    config = with_overrides("core", ["drop_superseded=True", "evidence.recent=2", "evidence.goal=0",
                                     "evidence.state=0", "evidence.source=0", "k=8"])
    out = GEM(config, encoder=HashEncoder(64), token_counter=None).compress(messages, session_id="s")
    assert out.stats.action == "reselected"
    assert not set(out.stats.core) & set(range(9))  # the nine older reads of app/views.py are superseded by the tenth


def test_the_cache_aware_preset_ranks_by_the_router_and_the_geometry_preset_keeps_the_paper_selection():
    assert resolve_config("cache-aware").ranking == "router"
    assert resolve_config("cache-aware-geometry").ranking == "geometry"
    assert resolve_config("paper").ranking == "geometry"
    with pytest.raises(ValueError, match="ranking must be one of"):
        with_overrides("paper", ["ranking=learned"])


def test_only_a_config_that_reads_lexicons_pays_for_them():
    """A block's lexicon (0.4 ms of regular expressions) is computed under the reference rule with each new block,
    under the router only once a rewrite ranks (None until then); other configs keep the empty one in the session's
    block cache."""
    from gemkernels.compress.gem import NO_LEXICON

    messages = history_of([("bash", f"cat mod/file_{i}.py", f"def name_{i}(): pass") for i in range(20)])
    for config, reads in (("paper", False), ("cache-aware-geometry", False), ("cache-aware", None),
                          (with_overrides("cache-aware", ["k=5", "min_blocks=6", "rewrite_above_blocks=10"]), True),
                          (with_overrides("paper", ["evidence.reference=1"]), True)):
        gem = GEM(config, encoder=HashEncoder(64), token_counter=None)
        gem.compress(messages, session_id="s")
        infos = list(gem.store.get("s").block_cache.values())
        if reads is None:
            assert all(info.lexicon is None for info in infos), config
        else:
            assert all((info.lexicon is not NO_LEXICON and info.lexicon.holds.size > 0) == reads for info in infos), \
                config


def test_a_router_session_keeps_the_held_index_of_its_blocks_and_a_geometry_session_keeps_none():
    """The index a session keeps is the one built from its first ``held.blocks`` lexicons (grown by a merge when a
    rewrite reads it, not on every append), and `indexed` brings it up to all of them; a config that ranks by
    geometry, which never reads it, keeps none."""
    from gemkernels.testing.histories import synthetic_history

    def same(a: HeldIndex, b: HeldIndex) -> bool:
        return (a.blocks, a.values.tolist(), a.owners.tolist()) == (b.blocks, b.values.tolist(), b.owners.tolist())

    history = synthetic_history(40, seed=3)
    rewrites_once = with_overrides("cache-aware", ["repay_factor=None", "reselect_on_goal_change=True"])
    lagged = 0
    for preset, indexed in (("cache-aware", True), (rewrites_once, True), ("paper", False)):
        gem = GEM(preset, encoder=HashEncoder(64), token_counter=None)
        for step, end in enumerate(range(len(history) - 20, len(history) + 1, 2)):  # a block more each request
            gem.compress(history[:end], session_id="s", goal="fix the parser" if step < 3 else "run the tests")
            columns = gem.store.get("s").columns
            if preset is rewrites_once and step < 3:  # no rewrite yet: nothing read the index
                assert columns.held is None
                continue
            assert (columns.held is not None) == indexed, preset
            base = sum(i.nbytes for i in columns.infos) + columns.embeddings.nbytes
            if indexed:
                kept = columns.held
                assert same(kept, HeldIndex.of(columns.lexicons[:kept.blocks]))
                assert columns.nbytes == base + kept.nbytes
                lagged += kept.blocks < len(columns.lexicons)  # appended since the rewrite: merged at the next
                assert all(lexicon is None for lexicon in columns.lexicons[kept.blocks:])  # and read there
                read = gem._read_lexicons(columns, parse_history(history[:end]), gem.store.get("s").block_keys, {})
                up = read.indexed()
                assert same(up.held, HeldIndex.of(read.lexicons))
                assert up.nbytes == sum(i.nbytes for i in read.infos) + read.embeddings.nbytes + up.held.nbytes
            else:
                assert columns.nbytes == base
    assert lagged >= 5  # the appends after the one rewrite left the kept index behind, as meant
