"""Bad input around reports: a malformed synthetic source, a split flag a synthetic source cannot honour, and the
sampled protocol on a catalogue too small for its negatives. One line, exit 2, no traceback, nothing written."""

import pytest
from _bad_input import assert_user_error, files_under, run_cli
from _shared import write


def _small_catalogue(folder):
    """ml-latest-small's layout: 6 users, each rating 5 of 6 movies (too few items for 99 negatives)."""
    rows = [(u, (u + j) % 6, j) for u in range(6) for j in range(5)]
    write(
        folder / "ratings.csv",
        "userId,movieId,rating,timestamp\n" + "".join(f"{u + 1},{i + 1},4.0,{1000 + 10 * u + t}\n" for u, i, t in rows),
    )
    write(
        folder / "movies.csv", "movieId,title,genres\n" + "".join(f"{i + 1},Film {i} (2000),Drama\n" for i in range(6))
    )
    return folder


@pytest.mark.parametrize(
    "argv, needles",
    [
        (["synthetic:300by200"], ["SOURCE 'synthetic:300by200'", "synthetic:USERSxITEMS"]),
        (["synthetic:300x4"], ["SOURCE 'synthetic:300x4'", "10 items"]),
        (["synthetic:300x200", "--k-core", "5"], ["--k-core 5", "already split leave-one-out"]),
        (["synthetic:300x200", "--split", "ratio"], ["--split ratio", "already split leave-one-out"]),
    ],
)
def test_synthetic_source_faults(tmp_path, argv, needles):
    out = tmp_path / "run"
    res = run_cli("run", *argv, "--backbone", "pop", "--out", out)
    assert_user_error(res, *needles)
    assert not out.exists() or not files_under(out)


@pytest.mark.parametrize("backbone", ["pop", "fedavg"])
def test_sampled_protocol_on_a_catalogue_too_small_for_its_negatives(tmp_path, backbone):
    # refused before anything trains (a federated run used to train a round first, and its progress bar cut
    # into the error line)
    folder = _small_catalogue(tmp_path / "small")
    out = tmp_path / "run"
    res = run_cli("run", folder, "--backbone", backbone, "--protocol", "sampled99", "--out", out)
    assert_user_error(res, "--protocol sampled99", "fewer than 99 items they never interacted with", "--protocol full")
    assert "round" not in res.err
    assert not out.exists() or not files_under(out)
