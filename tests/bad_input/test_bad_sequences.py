"""Bad S3Rec sequence files and attribute files: one line naming the file and the line, exit 2, nothing written."""

import json

import pytest
from _bad_input import assert_user_error, files_under, run_cli
from _shared import write

GOOD_SEQUENCES = "1 1 2 3\n2 2 3 4\n3 4 1 2\n4 3 4 1\n5 1 3 2\n"
GOOD_ATTRIBUTES = {"1": [1, 2], "2": [2], "3": [3], "4": [1, 3]}
GOOD_ATTRIBUTES_JSON = json.dumps(GOOD_ATTRIBUTES)


def _check(tmp_path, sequences=GOOD_SEQUENCES, attributes=GOOD_ATTRIBUTES_JSON, *needles, target=None):
    write(tmp_path / "Toy.txt", sequences)
    write(tmp_path / "Toy_item2attributes.json", attributes)
    before = files_under(tmp_path)
    line = assert_user_error(run_cli("data", "stats", str(target or tmp_path)), *needles)
    assert files_under(tmp_path) == before
    return line


@pytest.mark.parametrize(
    "sequences, needles",
    [
        # past the lines detection looks at, so the folder is recognised and the loader names the line
        (GOOD_SEQUENCES + "6 2 x3 4\n", ("Toy.txt", "line 6", "'x3' is not an integer id")),
        (GOOD_SEQUENCES + "6 1 2\n7\n", ("Toy.txt", "line 7", "user 7 has no items")),
        (GOOD_SEQUENCES + "6 1 2\n2 4 3\n", ("Toy.txt", "line 7", "user 2 already has a sequence on line 2")),
        (
            "1 5\n1 6\n2 5\n",
            ("Toy.txt", "line 2", "user 1 already has a sequence on line 1", "one 'user item' pair a line"),
        ),
    ],
    ids=["non-integer-token", "user-without-items", "duplicate-user", "one-pair-a-line"],
)
def test_bad_sequence_line(tmp_path, sequences, needles):
    _check(tmp_path, sequences, json.dumps(GOOD_ATTRIBUTES), *needles)


def test_a_txt_passed_directly_that_is_not_sequences_says_why(tmp_path):
    _check(
        tmp_path,
        "1 2 3\nuser item\n",
        json.dumps(GOOD_ATTRIBUTES),
        "Toy.txt",
        "not a sequence file",
        "line 2",
        "'user' is not an integer id",
        target=tmp_path / "Toy.txt",
    )


@pytest.mark.parametrize(
    "attributes, needles",
    [
        ('[[1, 2], [2]]', ("Toy_item2attributes.json", "line 1", "expected {item id: [attribute ids]}", "list")),
        ('{\n "1": [1],\n "2": 5\n}', ("Toy_item2attributes.json", "line 3", "item '2'", "got int 5")),
        (
            '{\n "1": [1],\n "two": [2]\n}',
            ("Toy_item2attributes.json", "line 3", "item 'two'", "not an integer item id"),
        ),
        (
            '{\n "1": [1],\n "2": [2, "brand"]\n}',
            ("Toy_item2attributes.json", "line 3", "item '2'", 'attribute "brand" is not a non-negative integer id'),
        ),
        ('{"1": [1], "2": [2}', ("Toy_item2attributes.json", "line 1", "not valid JSON", "column 19")),
        ('{"1": [], "2": []}', ("Toy_item2attributes.json", "no attribute ids at all")),
    ],
    ids=["not-an-object", "value-not-a-list", "key-not-an-id", "attribute-not-an-id", "broken-json", "no-attributes"],
)
def test_bad_attributes_file(tmp_path, attributes, needles):
    _check(tmp_path, GOOD_SEQUENCES, attributes, *needles)


def test_a_run_on_bad_sequences_leaves_no_run_folder(tmp_path):
    data = tmp_path / "data"
    write(data / "Toy.txt", GOOD_SEQUENCES + "6 1 2\n2 4 3\n")
    out = tmp_path / "run"
    res = run_cli("run", str(data), "--backbone", "fedavg", "--rounds", "1", "--out", str(out))
    assert_user_error(res, "Toy.txt", "line 7", "user 2 already has a sequence")
    assert not out.exists()
