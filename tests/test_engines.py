"""Both engines through the command line, from the same vectors: `build --engine seismic` beside the Lucene index,
`search` reading the engine from the index's record, query vectors given instead of texts, and the refusals (one
line each). Real Seismic and Lucene indexes, built here from the shipped sample encoded by the real model."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest
from cli_runner import run_cli
from procs import children, wait_dead
from test_faults import ENV, LSR, leftovers, synthetic_vectors

from lsr_index.engines.index import INDEX_MANIFEST, index_record
from lsr_index.errors import LsrIndexError
from lsr_index.search import quantized_vectors
from lsr_index.vectors.quantize import Quantization

pytest.importorskip("seismic")

SAMPLE = Path(__file__).resolve().parents[1] / "data" / "sample"
QUERIES, QRELS = SAMPLE / "queries.tsv", SAMPLE / "qrels.tsv"


def lsr(work: Path, *args: str):
    return run_cli("--quiet", "--workdir", str(work), *args)


def ok(done) -> str:
    assert done.returncode == 0, done.stderr
    return done.stdout


def refused(done) -> str:
    """The one line a refusal prints (exit 1, no traceback)."""
    assert done.returncode == 1 and "Traceback" not in done.stderr, (done.returncode, done.stderr)
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith("error: ")
    return line


def metrics(stdout: str) -> dict[str, float]:
    words = stdout.strip().splitlines()[-1].split()
    return {name: float(value) for name, value in zip(words[::2], words[1::2])}


@pytest.fixture(scope="module")
def sample(tmp_path_factory) -> Path:
    """The sample encoded as the README's main job encodes it, and both engines' indexes at their default places."""
    work = tmp_path_factory.mktemp("engines")
    ok(lsr(work, "encode", str(SAMPLE / "corpus.jsonl"), "--preset", "splade-tiny"))
    ok(lsr(work, "build", "--engine", "seismic"))
    return work


@pytest.fixture(scope="module")
def both(sample) -> Path:
    ok(lsr(sample, "build", "--heap", "1g"))
    return sample


@pytest.fixture(scope="module")
def query_vectors(sample, tmp_path_factory) -> Path:
    """The sample queries as vectors, encoded as `search` encodes them: JSONL {"id", "vector"} of integer impacts."""
    from lsr_index.inputs.topics import read_queries
    from lsr_index.search import encode_queries, load_query_encoder

    encoder, quantization, manifest = load_query_encoder(sample / "seismic", None, "cpu", "auto")
    encoded = encode_queries(encoder, quantization, read_queries(QUERIES), manifest.encoder.query_max_length)
    path = tmp_path_factory.mktemp("query-vectors") / "queries.jsonl"
    path.write_text("".join(json.dumps({"id": qid, "vector": vector}) + "\n" for qid, vector in encoded))
    return path


@pytest.mark.slow
@pytest.mark.lucene
def test_seismic_at_its_defaults_scores_the_sample_as_lucenes_exact_run(both):
    """nDCG@10 of the two engines' runs of the sample queries within 0.005, each index at its default place and
    each search told nothing of the engine."""
    lucene = metrics(ok(lsr(both, "search", "--queries", str(QUERIES), "--qrels", str(QRELS),
                            "--run", str(both / "runs" / "lucene.trec"))))
    seismic = metrics(ok(lsr(both, "search", "--index", str(both / "seismic"), "--queries", str(QUERIES),
                             "--qrels", str(QRELS), "--run", str(both / "runs" / "seismic.trec"))))
    assert abs(seismic["nDCG@10"] - lucene["nDCG@10"]) <= 0.005, (seismic, lucene)
    assert lucene["nDCG@10"] > 0.5
    assert index_record(both / "seismic").engine == "seismic" and index_record(both / "index").engine == "lucene"


@pytest.mark.slow
def test_search_reads_the_engine_from_the_index_and_checks_a_given_one(sample):
    run = sample / "runs" / "by-record.trec"
    ok(lsr(sample, "search", "--index", str(sample / "seismic"), "--queries", str(QUERIES), "--run", str(run),
           "--hits", "10"))
    assert run.read_text().count("\n") == 60 * 10
    by_engine = sample / "runs" / "by-engine.trec"
    ok(lsr(sample, "search", "--engine", "seismic", "--queries", str(QUERIES), "--run", str(by_engine),
           "--hits", "10"))  # --engine alone: the index at the engine's default place
    assert by_engine.read_text() == run.read_text()
    line = refused(lsr(sample, "search", "--index", str(sample / "seismic"), "--engine", "lucene", "--queries",
                       str(QUERIES)))
    assert f"{sample / 'seismic'} is a seismic index" in line and "--engine seismic" in line


@pytest.mark.slow
def test_a_workdir_holding_only_a_seismic_index_names_it_when_search_is_not_told(sample, tmp_path):
    work = tmp_path / "work"
    work.mkdir()
    shutil.copytree(sample / "seismic", work / "seismic")
    line = refused(lsr(work, "search", "--queries", str(QUERIES)))
    assert f"{work / 'index'}: no index here" in line and "--engine seismic" in line
    assert not (work / "runs").exists()


@pytest.mark.slow
@pytest.mark.lucene
@pytest.mark.parametrize("engine", ["lucene", "seismic"])
def test_query_vectors_search_as_the_queries_they_encode(both, query_vectors, tmp_path, engine):
    """The same run file from the texts and from their vectors, integer impacts or fractional weights."""
    index = both / ("index" if engine == "lucene" else "seismic")
    runs = {name: tmp_path / f"{name}.trec" for name in ("texts", "impacts", "weights")}
    ok(lsr(both, "search", "--index", str(index), "--queries", str(QUERIES), "--run", str(runs["texts"])))
    ok(lsr(both, "search", "--index", str(index), "--query-vectors", str(query_vectors), "--run",
           str(runs["impacts"])))
    weights = tmp_path / "weights.jsonl"
    with open(weights, "w") as f:
        for line in query_vectors.read_text().splitlines():
            record = json.loads(line)
            f.write(json.dumps({"id": record["id"], "vector": {t: w / 100 for t, w in record["vector"].items()}})
                    + "\n")
    done = lsr(both, "search", "--index", str(index), "--query-vectors", str(weights), "--run", str(runs["weights"]))
    assert "quantized as the index's queries are (impact = round(weight × 100))" in ok(done) + done.stderr
    assert runs["impacts"].read_bytes() == runs["texts"].read_bytes() == runs["weights"].read_bytes()


@pytest.mark.slow
def test_query_vectors_default_their_run_name_and_refuse_a_model(sample, query_vectors):
    ok(lsr(sample, "search", "--engine", "seismic", "--query-vectors", str(query_vectors), "--hits", "5"))
    assert (sample / "runs" / "queries.trec").read_text().count("\n") == 60 * 5
    line = refused(lsr(sample, "search", "--engine", "seismic", "--query-vectors", str(query_vectors), "--model",
                       "splade-tiny"))
    assert "--query-vectors are encoded already" in line


@pytest.mark.parametrize(("content", "message"), [
    ('{"id": "q1", "vector": {"a": -1}}\n', ":1: query 'q1': the weight -1 of term 'a' is not a non-negative number"),
    ('{"id": "q1", "vector": {"a": 1}}\n{"id": "q1", "vector": {"b": 2}}\n', ":2: duplicate query id 'q1'"),
    ('{"id": "q1", "vector": {"a": 1, "a": 2}}\n', ":1: not a query vector record: the name 'a' appears twice"),
    ('{"id": "q1", "vector": {"a": NaN}}\n', ":1: not a query vector record: NaN is not a number JSON allows"),
    ('{"id": "q1", "text": "sleep"}\n', ":1: query 'q1': no 'vector' object"),
    ('{"vector": {"a": 1}}\n', ":1: no field '_id' or 'id' or 'qid'"),
    ("\n", ": no query vectors"),
])
def test_bad_query_vectors_are_refused_with_their_line(tmp_path, content, message):
    path = tmp_path / "q.jsonl"
    path.write_text(content)
    line = refused(lsr(tmp_path, "search", "--query-vectors", str(path)))
    assert f"{path}{message}" in line, line


def test_query_vectors_need_one_source_of_queries(tmp_path):
    for args in ((), ("--queries", str(QUERIES), "--query-vectors", str(QUERIES))):
        done = lsr(tmp_path, "search", *args)
        assert done.returncode == 2 and "--queries (texts) or --query-vectors" in done.stderr


def test_fractional_weights_are_quantized_and_integers_kept():
    quantization = Quantization(scale=100.0)
    assert quantized_vectors([("q", {"a": 3, "b": 0, "c": 70})], quantization) == [("q", {"a": 3, "c": 70})]
    said = []
    got = quantized_vectors([("q", {"a": 0.57, "b": 0.004, "c": 2}), ("r", {"d": 1.005})], quantization, said.append)
    assert got == [("q", {"a": 57, "c": 200}), ("r", {"d": 100})]  # float32 × 100, rounded half to even
    assert len(said) == 1 and "round(weight × 100)" in said[0]
    with pytest.raises(LsrIndexError, match="query 'q': the impact 2147483648 of term 'a' is past 2,147,483,647"):
        quantized_vectors([("q", {"a": 2**31})], quantization)


@pytest.mark.slow
@pytest.mark.parametrize(("args", "message"), [
    (("build", "--n-postings", "10"), "--n-postings is Seismic's option, and this is a lucene build: add --engine "
                                      "seismic"),
    (("build", "--engine", "seismic", "--heap", "2g"), "--heap is Lucene's option, and this is a seismic build"),
    (("build", "--engine", "seismic", "--builder", "anserini"), "--builder is Lucene's option"),
    (("search", "--engine", "seismic", "--queries", str(QUERIES), "--model", "not-a-model"), "not-a-model"),
])
def test_options_of_the_other_engine_and_another_model_are_refused(sample, args, message):
    assert message in refused(lsr(sample, *args))


@pytest.mark.slow
@pytest.mark.lucene
def test_seismic_knobs_are_refused_for_a_lucene_index(both):
    line = refused(lsr(both, "search", "--queries", str(QUERIES), "--query-cut", "5"))
    assert f"{both / 'index'} is a Lucene index" in line and "--query-cut" in line


@pytest.mark.slow
def test_another_model_is_refused_for_a_seismic_index(sample, splade_tiny, tmp_path):
    from safetensors.torch import load_file, save_file

    other = tmp_path / "other-model"
    shutil.copytree(splade_tiny.path, other)
    weights = load_file(other / "model.safetensors")
    weights["cls.predictions.bias"] = weights["cls.predictions.bias"] + 0.5
    save_file(weights, other / "model.safetensors")
    line = refused(lsr(sample, "search", "--engine", "seismic", "--queries", str(QUERIES), "--model", str(other)))
    assert "is not the one that encoded" in line


@pytest.mark.parametrize(("option", "value"), [("--n-postings", "0"), ("--centroid-fraction", "0.0"),
                                               ("--summary-energy", "1.5"), ("--doc-cut", "0")])
def test_seismic_build_knobs_out_of_range_are_one_clear_line(tmp_path, option, value):
    done = lsr(tmp_path, "build", "--engine", "seismic", option, value)
    assert done.returncode == 2 and f"Invalid value for '{option}': {value} is not in the range" in done.stderr


@pytest.mark.parametrize(("option", "value"), [("--query-cut", "0"), ("--heap-factor", "1.01"),
                                               ("--heap-factor", "-0.1")])
def test_seismic_search_knobs_out_of_range_are_one_clear_line(tmp_path, option, value):
    done = lsr(tmp_path, "search", "--queries", str(QUERIES), option, value)
    assert done.returncode == 2 and f"Invalid value for '{option}': {value} is not in the range" in done.stderr


@pytest.mark.slow
def test_search_knobs_trade_accuracy_for_speed_on_the_same_index(sample, tmp_path):
    """The exact setting (every list, every block) and a cheap one: both write full runs of exact scores."""
    exact, cheap = tmp_path / "exact.trec", tmp_path / "cheap.trec"
    ok(lsr(sample, "search", "--engine", "seismic", "--queries", str(QUERIES), "--run", str(exact),
           "--query-cut", "100000", "--heap-factor", "0"))
    ok(lsr(sample, "search", "--engine", "seismic", "--queries", str(QUERIES), "--run", str(cheap),
           "--query-cut", "1", "--heap-factor", "1", "--threads", "1"))
    assert exact.read_text() != cheap.read_text() and cheap.read_text().count("\n") > 0


@pytest.mark.slow
def test_a_damaged_seismic_index_is_refused_by_search_in_one_line(sample, tmp_path):
    index = tmp_path / "seismic"
    shutil.copytree(sample / "seismic", index)
    with open(index / "seismic.index.seismic", "r+b") as f:
        f.seek(1000)
        f.write(b"\x00" * 64)
    line = refused(lsr(sample, "search", "--index", str(index), "--queries", str(QUERIES)))
    assert f"{index}: the Seismic index is damaged: seismic.index.seismic fails its checksum" in line
    assert "/proc/" not in line


@pytest.mark.slow
def test_an_index_record_of_an_unknown_engine_is_refused(sample, tmp_path):
    index = tmp_path / "seismic"
    shutil.copytree(sample / "seismic", index)
    record = json.loads((index / INDEX_MANIFEST).read_text())
    (index / INDEX_MANIFEST).write_text(json.dumps({**record, "engine": "bm25s"}))
    line = refused(lsr(sample, "search", "--index", str(index), "--queries", str(QUERIES)))
    assert "an index of engine 'bm25s', which this lsr-index does not know" in line


@pytest.mark.slow
@pytest.mark.lucene
def test_overwrite_replaces_one_engines_index_with_the_others(sample, tmp_path):
    """An index of either engine is an lsr-index index: --overwrite replaces it, and search follows the record;
    without --overwrite, or with a file lsr-index did not write inside, it is refused."""
    index = tmp_path / "index"
    ok(lsr(sample, "build", "--index", str(index), "--heap", "1g"))
    assert "pass --overwrite" in refused(lsr(sample, "build", "--engine", "seismic", "--index", str(index)))
    ok(lsr(sample, "build", "--engine", "seismic", "--index", str(index), "--overwrite", "--n-postings", "50"))
    record = index_record(index)
    assert record.engine == "seismic" and record.settings["options"]["n_postings"] == 50
    assert not list(index.glob("segments_*")) and leftovers(tmp_path) == []
    ok(lsr(sample, "search", "--index", str(index), "--queries", str(QUERIES), "--run", str(tmp_path / "r.trec")))
    (index / "notes.txt").write_text("mine")
    line = refused(lsr(sample, "build", "--index", str(index), "--overwrite", "--heap", "1g"))
    assert "holds 'notes.txt', which lsr-index build did not write" in line


@pytest.mark.slow
def test_the_python_api_builds_and_searches_seismic_from_vectors(sample, query_vectors, tmp_path):
    from lsr_index import api

    record = api.build(sample / "vectors", tmp_path / "seismic", engine="seismic", seismic={"n_postings": 200})
    assert record.engine == "seismic" and record.documents == 400
    from_file = api.search(tmp_path / "seismic", vectors=query_vectors, hits=10, seismic={"query_cut": 20})
    given = [(r["id"], r["vector"]) for r in map(json.loads, query_vectors.read_text().splitlines())]
    assert api.search(tmp_path / "seismic", vectors=given, hits=10, seismic={"query_cut": 20}) == from_file
    assert len(from_file) == 60 and all(len(hits) == 10 for hits in from_file.values())
    with pytest.raises(LsrIndexError, match="Seismic build options given for a Lucene build"):
        api.build(sample / "vectors", tmp_path / "lucene", seismic={"n_postings": 10})
    with pytest.raises(LsrIndexError, match="unknown seismic option 'n_posting'"):
        api.build(sample / "vectors", tmp_path / "other", engine="seismic", seismic={"n_posting": 10})


@pytest.fixture(scope="module")
def long_build(tmp_path_factory) -> Path:
    """Vectors whose Seismic build takes long enough to be stopped midway."""
    out = tmp_path_factory.mktemp("long") / "vectors"
    synthetic_vectors(out, docs=60_000, terms=30, shard_docs=20_000)
    return out


def _builder(pid: int) -> list[int]:
    return children(pid, b"lsr_index.engines.seismic.build")


@pytest.mark.slow
@pytest.mark.parametrize("how", [signal.SIGINT, signal.SIGTERM])
def test_a_stopped_seismic_build_ends_its_builder_and_publishes_nothing(long_build, tmp_path, how):
    """Ctrl-C (to the whole process group, as a terminal sends it) or SIGTERM while Seismic builds: the builder
    process ends, the work directory goes, no index appears, and the message says how to resume."""
    index = tmp_path / "seismic"
    proc = subprocess.Popen([*LSR, "build", "--engine", "seismic", "--vectors", str(long_build), "--index",
                             str(index)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV,
                            start_new_session=True)
    deadline = time.time() + 120
    while time.time() < deadline and proc.poll() is None and not _builder(proc.pid):
        time.sleep(0.05)
    builders = _builder(proc.pid)
    assert builders and proc.poll() is None, f"the builder did not start: {proc.communicate()}"
    time.sleep(1.0)
    assert proc.poll() is None, "the build ended before the signal"
    if how == signal.SIGINT:
        os.killpg(proc.pid, signal.SIGINT)
    else:
        os.kill(proc.pid, signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 128 + how
    assert err.strip().splitlines()[-1].endswith("rerun the same command to continue where it stopped")
    assert all(wait_dead(pid, 10) for pid in builders)
    assert not index.exists() and leftovers(tmp_path) == []
