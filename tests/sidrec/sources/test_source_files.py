"""``source_files``: every file a source reads, which the ingest stage's cache key hashes (a
file left out would let a changed input be served from cache)."""

from __future__ import annotations

from pathlib import Path

from sidrec.config import AmazonConfig, IngestConfig
from sidrec.sources import source_files


def test_each_source_names_every_file_it_reads(tmp_path: Path) -> None:
    movielens = source_files(IngestConfig())
    assert [p.name for p in movielens] == ["ml-100k.inter", "ml-100k.item"]
    assert all(p.is_file() for p in movielens)  # the files of the installed RecBole wheel

    csv = IngestConfig(source="csv", interactions=tmp_path / "i.csv", items=tmp_path / "t.csv")
    assert source_files(csv) == [tmp_path / "i.csv", tmp_path / "t.csv"]

    amazon = IngestConfig(
        source="amazon",
        amazon=AmazonConfig(reviews=tmp_path / "r.jsonl", meta=tmp_path / "m.jsonl"),
    )
    assert source_files(amazon) == [tmp_path / "r.jsonl", tmp_path / "m.jsonl"]

    folder = tmp_path / "minionerec"
    for name in ("Toys.train.csv", "Toys.item.json", "sub/Toys.index.json"):
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text("{}")
    files = source_files(IngestConfig(source="minionerec", path=folder))
    assert [p.relative_to(folder).as_posix() for p in files] == [
        "Toys.item.json",
        "Toys.train.csv",
        "sub/Toys.index.json",
    ]
    single = folder / "Toys.train.csv"
    assert source_files(IngestConfig(source="minionerec", path=single)) == [single]
