"""`lsr-index inspect` on real vectors (the real model over sample documents) and a real Lucene index.

Every figure it prints is checked against one computed here from the shards with `read_shard` and numpy.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections import Counter
from dataclasses import asdict
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from transformers import AutoTokenizer

from lsr_index.cli import main
from lsr_index.encode.job import EncodeJob, EncodeOptions
from lsr_index.encode.run import encode_corpus
from lsr_index.vectors.manifest import Manifest
from lsr_index.vectors.shards import read_shard

SAMPLE = Path(__file__).resolve().parents[1] / "data" / "sample"
LSR = [sys.executable, "-m", "lsr_index"]
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def work(splade_tiny, tmp_path_factory) -> Path:
    """40 sample documents in three jsonl.gz shards, encoded by the real splade-tiny."""
    work = tmp_path_factory.mktemp("inspect")
    lines = (SAMPLE / "corpus.jsonl").read_text().splitlines()[:40]
    (work / "docs.jsonl").write_text("\n".join(lines) + "\n")
    options = EncodeOptions(doc_max_length=96, shard_docs=15, progress=False)
    encode_corpus(EncodeJob(inputs=(str(work / "docs.jsonl"),), options=options), work / "vectors", ("cpu",))
    return work


def vectors_of(directory: Path) -> dict[str, dict[str, int]]:
    manifest = Manifest.load(directory)
    return {doc: vec for shard in manifest.shards for doc, vec in read_shard(directory / shard.file)}


def inspect(work: Path, *args: str) -> dict:
    result = CliRunner().invoke(main, ["-q", "-w", str(work), "inspect", "--json", *args])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def test_corpus_statistics_equal_an_independent_count(work, splade_tiny):
    vectors = vectors_of(work / "vectors")
    nonzeros = np.array([len(v) for v in vectors.values()])
    impacts = np.array([w for v in vectors.values() for w in v.values()])
    df = Counter(term for v in vectors.values() for term in v)
    corpus = inspect(work, "--top", "5")["corpus"]
    assert corpus["documents"] == len(vectors) == 40 and corpus["complete"]
    for got, values in ((corpus["nonzeros_per_doc"], nonzeros), (corpus["impacts"], impacts)):
        assert got["count"] == len(values) and got["mean"] == pytest.approx(values.mean(), abs=1e-3)
        assert (got["min"], got["max"]) == (values.min(), values.max())
        for name, q in (("p5", 0.05), ("p25", 0.25), ("median", 0.5), ("p75", 0.75), ("p95", 0.95)):
            assert got[name] == np.quantile(values, q, method="inverted_cdf"), name
    vocab = corpus["vocabulary"]
    assert vocab["terms_used"] == len(df) and vocab["vocab_size"] == splade_tiny.vocab_size
    assert vocab["coverage"] == pytest.approx(len(df) / splade_tiny.vocab_size, abs=1e-4)
    ranked = sorted(df.items(), key=lambda item: (-item[1], item[0]))[:5]
    assert [(t, n) for t, n, _ in vocab["top_df"]] == ranked
    assert corpus["truncation"] == {"doc_max_length": 96, **asdict(Manifest.load(work / "vectors").truncation)}


def test_truncation_is_what_the_encoder_counted(work):
    """Sample documents run to ~600 tokens: most are cut at 96, as the encoder counted them shard by shard."""
    manifest = Manifest.load(work / "vectors")
    cut = manifest.truncation
    assert 0 < cut.documents <= 40 and cut.longest_tokens > 96 and cut.share == cut.documents / 40
    text = CliRunner().invoke(main, ["-q", "inspect", "--vectors", str(work / "vectors")]).stdout
    assert f"truncated at doc_max_length: {cut.documents} documents ({cut.share:.1%}) at 96 tokens; the longest had " \
        f"{cut.longest_tokens:,} tokens" in text


def test_documents_show_their_largest_impacts(work):
    vectors = vectors_of(work / "vectors")
    ids = list(vectors)
    wanted = [ids[20], ids[3]]  # the second shard, then the first: order of the request is kept
    docs = inspect(work, *wanted, "--top", "7")["documents"]
    assert [d["id"] for d in docs] == wanted
    for doc in docs:
        vector = vectors[doc["id"]]
        assert doc["terms"] == len(vector) and doc["impact_sum"] == sum(vector.values())
        expected = sorted(vector.items(), key=lambda item: (-item[1], item[0]))[:7]
        assert [tuple(pair) for pair in doc["top"]] == expected
    assert docs[0]["shard"] == Manifest.load(work / "vectors").shards[1].file


def test_an_unknown_id_is_one_clear_line(work):
    done = subprocess.run([*LSR, "-w", str(work), "inspect", "no-such-doc"], capture_output=True, text=True)
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert done.stderr.strip().splitlines() == [
        f"error: {work / 'vectors'}: no document with id 'no-such-doc' among its 40 documents"]


def test_a_damaged_shard_is_one_clear_line(work, tmp_path):
    copy = tmp_path / "vectors"
    shutil.copytree(work / "vectors", copy)
    shard = copy / Manifest.load(copy).shards[1].file
    shard.write_bytes(shard.read_bytes()[:200])
    done = subprocess.run([*LSR, "inspect", "--vectors", str(copy)], capture_output=True, text=True)
    assert done.returncode == 1 and "Traceback" not in done.stderr
    line, = done.stderr.strip().splitlines()
    assert line.startswith(f"error: {shard}: cannot read the shard") and "encode --overwrite" in line


def test_png_histograms(work, tmp_path):
    pytest.importorskip("matplotlib")
    png = tmp_path / "figs" / "stats.png"
    done = subprocess.run([*LSR, "-w", str(work), "inspect", "--png", str(png)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert png.read_bytes().startswith(PNG_MAGIC) and png.stat().st_size > 10_000
    assert f"histograms → {png}" in done.stdout and "nonzeros per document: mean" in done.stdout
    assert [p.name for p in png.parent.iterdir()] == ["stats.png"]  # no temporary file left


def test_png_without_matplotlib_says_what_to_install(work, tmp_path):
    blocker = tmp_path / "block" / "matplotlib"
    blocker.mkdir(parents=True)
    (blocker / "__init__.py").write_text("raise ImportError('matplotlib is blocked for this test')\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(blocker.parent), os.environ.get("PYTHONPATH", "")])}
    png = tmp_path / "stats.png"
    done = subprocess.run([*LSR, "-w", str(work), "inspect", "--png", str(png)], capture_output=True, text=True,
                          env=env)
    assert done.returncode == 1 and not png.exists()
    assert done.stderr.strip().splitlines() == [
        "error: --png needs matplotlib: pip install matplotlib, or pip install -e '.[bench]' in the lsr-index checkout "
        "(or bash pipelines/setup.sh --dev)"]


@pytest.mark.lucene
def test_query_expansion_is_what_search_sends(work, splade_tiny):
    import torch

    from lsr_index.engines.lucene.build import build_index
    from lsr_index.model.encoder import SpladeEncoder

    build_index(work / "vectors", work / "index", threads=1, heap="1g", progress=False)
    text = "does sleep deprivation impair memory"
    query, = inspect(work, "--query", text, "--top", "1000")["queries"]
    weights = SpladeEncoder(splade_tiny).encode([text], 64)[0]  # 64: the manifest's query_max_length
    impacts = torch.round(weights * 100)
    expected = {splade_tiny.vocab[i]: int(impacts[i]) for i in torch.nonzero(impacts).flatten().tolist()}
    assert {term: impact for term, impact, _ in query["top"]} == expected
    own = set(AutoTokenizer.from_pretrained(splade_tiny.path).tokenize(text))  # transformers' own split
    assert all(flag == (term in own) for term, _, flag in query["top"])
    assert query["expansion_terms"] == sum(term not in own for term in expected) > 0
    assert query["model"] == "splade-tiny" and query["terms"] == len(expected)
