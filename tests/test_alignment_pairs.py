import numpy as np
import pandas as pd
import pytest
from _shared import jsonl, shared_data, write

from fedvlr_plus.alignment.pairs import (
    PreferencePairs,
    annotator_pairs,
    assign_clients,
    genre_matrix,
    hh_pairs,
    holdout_split,
    kmeans,
    last_human_turn,
    pairwise_accuracy,
    purity,
    rating_pairs,
    read_hh,
    silhouette,
    split_dialogue,
    user_groups,
)
from fedvlr_plus.datasets import InteractionData


def _tiny_ratings(users=None):
    # user a: item x = 5, y = 3, z = 1; user b: x = 4, y = 4 (no pair with gap 2)
    data = InteractionData.from_raw(
        "tiny", ["a", "a", "a", "b", "b"], ["x", "y", "z", "x", "y"], rating=[5, 3, 1, 4, 4], timestamp=[1, 2, 3, 4, 5]
    )
    items = pd.DataFrame({"title": ["X", "Y", "Z"], "categories": [["Comedy"], ["Horror"], ["Comedy", "Horror"]]})
    return data.replace(items=items, users=users if users is not None else pd.DataFrame())


def test_rating_pairs_hand_computed_contexts_exclude_the_pair():
    data = _tiny_ratings()
    feats = np.eye(3, dtype=np.float32)
    p = rating_pairs(data, feats, min_gap=2, max_pairs_per_user=None)
    got = sorted(zip(p.chosen_item.tolist(), p.rejected_item.tolist()))
    assert got == [(0, 1), (0, 2), (1, 2)]  # gaps 2, 4, 2; user b has none
    assert (p.user == 0).all()
    # mean rating 3: weights (r - 3) f = [2 e0, 0, -2 e2]; the context leaves out the pair's two items, / (3 - 2)
    ctx = {pair: p.context[i] for i, pair in enumerate(zip(p.chosen_item.tolist(), p.rejected_item.tolist()))}
    np.testing.assert_allclose(ctx[(0, 1)], [0, 0, -2])
    np.testing.assert_allclose(ctx[(0, 2)], [0, 0, 0])
    np.testing.assert_allclose(ctx[(1, 2)], [2, 0, 0])
    np.testing.assert_array_equal(p.chosen, feats[p.chosen_item])


def test_rating_pairs_gap_filter_and_error():
    data = _tiny_ratings()
    p = rating_pairs(data, np.eye(3, dtype=np.float32), min_gap=4)
    assert list(zip(p.chosen_item, p.rejected_item)) == [(0, 2)]
    with pytest.raises(ValueError, match="no rating pair"):
        rating_pairs(data, np.eye(3, dtype=np.float32), min_gap=5)


def test_genres_and_user_groups():
    m, names = genre_matrix(_tiny_ratings().items)
    assert names == ("Comedy", "Horror")
    np.testing.assert_array_equal(m, [[1, 0], [0, 1], [1, 1]])
    users = pd.DataFrame({"age": [19, 50], "gender": ["F", "M"], "occupation": ["writer", "writer"]})
    data = _tiny_ratings(users)
    g, names = user_groups(data, "age")
    assert g.tolist() == [0, 2] and names[0] == "age<25"
    g, names = user_groups(data, "gender")
    assert g.tolist() == [0, 1] and names == ("F", "M")
    with pytest.raises(ValueError, match="unknown grouping"):
        user_groups(data, "zodiac")


def test_split_dialogue():
    c = "\n\nHuman: hi\n\nAssistant: hello\n\nHuman: what is 2+2?\n\nAssistant: 4"
    r = "\n\nHuman: hi\n\nAssistant: hello\n\nHuman: what is 2+2?\n\nAssistant: 5"
    prompt, a, b = split_dialogue(c, r)
    assert prompt.endswith("what is 2+2?") and (a, b) == ("4", "5")
    assert last_human_turn(prompt) == "what is 2+2?"
    assert split_dialogue(c, c) is None  # equal responses are dropped
    assert split_dialogue(c, "\n\nHuman: other\n\nAssistant: 5") is None  # no shared prompt


class _StubEncoder:
    """Deterministic bag-of-characters embedding; counts calls."""

    model_name = "stub"

    def __init__(self):
        self.calls = 0

    def embed(self, texts):
        self.calls += 1
        out = np.zeros((len(texts), 8), np.float32)
        for i, t in enumerate(texts):
            for ch in t:
                out[i, ord(ch) % 8] += 1
        return out / np.maximum(np.linalg.norm(out, axis=1, keepdims=True), 1e-9)


def _hh_folder(tmp_path):
    rows = [
        {
            "chosen": f"\n\nHuman: q{i}\n\nAssistant: good answer {i}",
            "rejected": f"\n\nHuman: q{i}\n\nAssistant: bad {i}",
        }
        for i in range(6)
    ]
    rows.append({"chosen": "\n\nHuman: same\n\nAssistant: x", "rejected": "\n\nHuman: same\n\nAssistant: x"})
    write(tmp_path / "hh" / "helpful-base-test.jsonl.gz", jsonl(rows))
    write(tmp_path / "hh" / "harmless-base-test.jsonl.gz", jsonl(rows[:4]))
    return tmp_path / "hh"


def test_hh_pairs_with_stub_encoder_and_cache(tmp_path):
    root = _hh_folder(tmp_path)
    enc = _StubEncoder()
    p = hh_pairs(root, encoder=enc, cache_dir=tmp_path / "cache", clients_per_split=2)
    assert len(p) == 10  # 6 helpful (equal pair dropped) + 4 harmless
    assert p.group_names == ("helpful-base", "harmless-base")
    assert p.group.tolist() == [0] * 6 + [1] * 4
    assert sorted(set(p.client[p.group == 0].tolist())) == [0, 1] and set(p.client[p.group == 1]) == {2, 3}
    assert enc.calls == 1
    np.testing.assert_allclose(p.context[0], enc.embed(["q0"])[0], atol=1e-6)
    p2 = hh_pairs(root, encoder=enc, cache_dir=tmp_path / "cache", clients_per_split=2)
    # the direct embed() above was the second call; the second hh_pairs is served from the cache
    assert enc.calls == 2 and np.array_equal(p2.chosen, p.chosen)


def test_read_hh_names_the_bad_line(tmp_path):
    path = write(tmp_path / "helpful-base-test.jsonl.gz", '{"chosen": "a"}\nnot json\n')
    with pytest.raises(ValueError, match=r"helpful-base-test.jsonl.gz: line 1"):
        read_hh(path)
    with pytest.raises(FileNotFoundError):
        read_hh(tmp_path / "missing.jsonl.gz")


def _pairs(n=40, clients=4):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(n, 3)).astype(np.float32)
    group = np.arange(n) % 2
    return PreferencePairs(
        context=x,
        chosen=x,
        rejected=-x,
        client=np.arange(n) % clients,
        group=group,
        group_names=("a", "b"),
        user=np.arange(n) // 2,
    )


def test_holdout_split_by_user_has_no_shared_users_and_assign_clients():
    p = _pairs()
    tr, te = holdout_split(p, 0.25, by="user")
    assert len(tr) + len(te) == len(p) and len(te) > 0
    assert not set(tr.user.tolist()) & set(te.user.tolist())
    for c in range(4):
        assert (tr.client == c).any() and (te.client == c).any()
    cl = assign_clients(np.array([0, 0, 0, 1, 1, 1, 1]), 2)
    assert set(cl[:3]) == {0, 1} and set(cl[3:]) == {2, 3}
    assert np.bincount(cl).tolist() == [2, 1, 2, 2]


def test_kmeans_balanced_purity_silhouette():
    x = np.array([[0.0], [0.1], [0.2], [0.3], [10.0], [10.1]])
    lab, _ = kmeans(x, 2, seed=0)
    assert len(set(lab[:4])) == 1 and lab[4] == lab[5] != lab[0]
    bal, _ = kmeans(x, 2, seed=0, balanced=True)
    assert np.bincount(bal).tolist() == [3, 3]
    assert purity(np.array([0, 0, 1, 1]), np.array([0, 0, 1, 0])) == pytest.approx(0.75)
    # two tight, far clusters: silhouette near 1
    assert silhouette(np.array([[0.0], [0.0], [9.0], [9.0]]), np.array([0, 0, 1, 1])) == pytest.approx(1.0)
    assert pairwise_accuracy([1, 2, 3], [0, 2, 4]) == pytest.approx(0.5)


def test_annotator_pairs_conflict_by_construction():
    n = 60
    rng = np.random.default_rng(1)
    items = pd.DataFrame(
        {
            "title": [f"m{i}" for i in range(n)],
            "categories": [["Children's"] if i % 2 else ["Horror"] for i in range(n)],
        }
    )
    users = np.repeat(np.arange(25), n)
    its = np.tile(np.arange(n), 25)
    # horror films rate higher on average: the two annotator types disagree on every (Horror, Children's) pair
    rating = np.where(its % 2 == 0, 4.0, 2.0) + rng.integers(0, 2, len(its))
    data = InteractionData.from_raw("t", users, its, rating=rating, item_order=np.arange(n)).replace(items=items)
    feats = genre_matrix(items)[0]
    p = annotator_pairs(data, feats, n_clients_per_type=2, pairs_per_client=5)
    assert len(p) == 20 and p.n_clients == 4
    assert genre_matrix(items)[1] == ("Children's", "Horror")
    quality, family = p.group == 0, p.group == 1
    # family picks the Children's film, quality the better-rated horror film
    assert (p.chosen[family][:, 0] == 1).all() and (p.rejected[family][:, 1] == 1).all()
    assert (p.chosen[quality][:, 1] == 1).all() and (p.rejected[quality][:, 0] == 1).all()


def _rated(n, categories, users=25, seed=1):
    """``users`` users rating every one of ``n`` items (each item rated >= 20 times), with these categories."""
    rng = np.random.default_rng(seed)
    its = np.tile(np.arange(n), users)
    data = InteractionData.from_raw(
        "t", np.repeat(np.arange(users), n), its, rating=rng.integers(1, 6, len(its)), item_order=np.arange(n)
    )
    return data.replace(items=pd.DataFrame({"title": [f"m{i}" for i in range(n)], "categories": categories}))


def test_annotator_pairs_refuse_data_without_the_family_genres_in_one_line():
    from fedvlr_plus.errors import ConfigError

    n = 30
    no_family = _rated(n, [["Comedy"] if i % 2 else ["Drama"] for i in range(n)])
    with pytest.raises(
        ConfigError,
        match=r"t: the simulated annotator types need ratings and MovieLens genres.*"
        r"30 items rated 20 or more times and 0 of those genres",
    ):
        annotator_pairs(no_family, genre_matrix(no_family.items)[0], n_clients_per_type=2, pairs_per_client=5)
    no_genres = _rated(n, [[] for _ in range(n)])
    with pytest.raises(ConfigError, match="0 of those genres"):
        annotator_pairs(no_genres, np.zeros((n, 1), np.float32), n_clients_per_type=2, pairs_per_client=5)


def test_annotator_pairs_stop_when_the_data_hold_too_few_conflict_pairs():
    """Family genres present, but the ratings never disagree with them: the draw gives up instead of spinning."""
    from fedvlr_plus.errors import ConfigError

    n = 30
    data = _rated(n, [["Children's"] if i % 2 else ["Horror"] for i in range(n)])
    data = data.replace(inter=data.inter.assign(rating=np.where(data.inter["item"] % 2 == 1, 5.0, 1.0)))
    with pytest.raises(ConfigError, match=r"only 0 of the 20 conflict pairs"):
        annotator_pairs(data, genre_matrix(data.items)[0], n_clients_per_type=2, pairs_per_client=5)


def test_real_hh_rlhf_and_ml100k_pairs():
    root = shared_data("hh-rlhf")
    trips = read_hh(root / "helpful-base-test.jsonl.gz", limit=200)
    assert len(trips) == 200 and all(a != b for _, a, b in trips)
    from fedvlr_plus.datasets import load

    data = load("ml-100k")
    feats = genre_matrix(data.items)[0]
    p = rating_pairs(data, feats, min_gap=2)
    # nearly every ml-100k user has some pair with a gap >= 2 (941 of 943, docs/alignment-preference.md)
    assert len(np.unique(p.user)) == 941


def make_hh_cached(tmp_path, n=30):
    """A tiny HH-RLHF folder whose embeddings are already in a cache under the default encoder's name, so the
    commands read them and never load MiniLM. Returns (folder, cache dir)."""

    rows = [
        {
            "chosen": f"\n\nHuman: question {i}\n\nAssistant: a careful helpful answer number {i}",
            "rejected": f"\n\nHuman: question {i}\n\nAssistant: no {i}",
        }
        for i in range(n)
    ]
    root = tmp_path / "hh"
    write(root / "helpful-base-test.jsonl.gz", jsonl(rows))
    write(
        root / "harmless-base-test.jsonl.gz", jsonl([{"chosen": r["rejected"], "rejected": r["chosen"]} for r in rows])
    )
    enc = _StubEncoder()
    enc.model_name = "all-MiniLM-L6-v2"
    hh_pairs(root, encoder=enc, cache_dir=tmp_path / "cache")
    return root, tmp_path / "cache"
