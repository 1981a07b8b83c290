"""lab/results.json, the one index of recorded results, is what `python -m lab.tools.index --write`
makes from the files' meta; its readers find files by kind / device / kernel and by name."""
from lab.tools import index


def test_the_index_is_current():
    assert index.main(["--check"]) == 0, "run python -m lab.tools.index --write"


def test_every_indexed_file_is_found_by_kind_and_by_name():
    rows = index.load()
    assert rows and all((index.ROOT / r["path"]).is_file() for r in rows)
    for r in rows[:: max(1, len(rows) // 20)]:
        assert r in index.recorded(kind=r["kind"], device=r["gpu"], kernel=r["kernel"].split(",")[0])
        name = r["path"].split("/", 3)[3]
        assert index.path_of(name) == index.ROOT / r["path"]


def test_every_indexed_name_is_one_file():
    """path_of finds a file by its name alone, so no two campaigns hold files of the same name."""
    names = [r["path"].split("/", 3)[3] for r in index.load()]
    twice = sorted({n for n in names if names.count(n) > 1})
    assert not twice, f"names in two campaigns: {twice}"
