"""A synthetic `vadersentiment` sdist in the real layout and format, for network-free tests.

The movie-review file has the real 10,605 rows (ids 1..5152 positive) so the real split sizes
hold; sentences are made-up, with sentiment words a model can learn.
"""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

import numpy as np

POSITIVE = ["wonderful", "moving", "brilliant", "funny", "gripping", "warm"]
NEGATIVE = ["dull", "tedious", "awful", "boring", "messy", "silly"]
FILLER = ["the", "film", "plot", "story", "acting", "is", "a", "and", "very", "its"]
OOD_SIZES = {"nytEditorialSnippets": 60, "tweets": 45, "amazonReviewSnippets": 40}


def _sentence(rng: np.random.Generator, words: list[str]) -> str:
    body = list(rng.choice(FILLER, rng.integers(3, 12))) + list(rng.choice(words, 2))
    rng.shuffle(body)
    return " ".join(body).capitalize() + "."


def _file(lines: list[str]) -> bytes:
    return "\r\n".join(lines).encode("utf-8")  # CRLF, no final newline, as the real files


def write_source(downloads: Path) -> Path:
    """Writes `downloads/vaderSentiment-3.3.2.tar.gz`; returns its path."""
    rng = np.random.default_rng(0)
    files = {
        "movieReviewSnippets": _file(
            [
                f"{i}\t{rng.uniform(0.5, 3) if i <= 5152 else -rng.uniform(0.5, 3):.4f}\t"
                + _sentence(rng, POSITIVE if i <= 5152 else NEGATIVE)
                for i in range(1, 10606)
            ]
        ),
    }
    for corpus, n in OOD_SIZES.items():
        files[corpus] = _file(
            [
                f"{i // 5 + 1}_{i % 5 + 1}\t0.1\t"
                + " ".join(rng.choice(["news", "today", "city", "the", "said"], 6))
                for i in range(n)
            ]
        )
    inner = io.BytesIO()
    with tarfile.open(fileobj=inner, mode="w:gz") as tar:
        for corpus, content in files.items():
            info = tarfile.TarInfo(f"hutto_ICWSM_2014/{corpus}_GroundTruth.txt")
            info.size = len(content)
            tar.addfile(info, io.BytesIO(content))
    downloads.mkdir(parents=True, exist_ok=True)
    path = downloads / "vaderSentiment-3.3.2.tar.gz"
    with tarfile.open(path, mode="w:gz") as tar:
        info = tarfile.TarInfo("vaderSentiment-3.3.2/additional_resources/hutto_ICWSM_2014.tar.gz")
        info.size = inner.getbuffer().nbytes
        tar.addfile(info, io.BytesIO(inner.getvalue()))
    return path
