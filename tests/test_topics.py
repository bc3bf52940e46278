"""Query and qrels readers: the formats in use (TREC, BEIR, Anserini TSV) and every rejected line."""

from __future__ import annotations

import gzip
import re
from pathlib import Path

import pytest

from lsr_index.errors import InputError
from lsr_index.inputs.topics import read_qrels, read_queries


def write(path: Path, data: str | bytes) -> Path:
    raw = data.encode() if isinstance(data, str) else data
    path.write_bytes(gzip.compress(raw) if path.name.endswith(".gz") else raw)
    return path


@pytest.mark.parametrize("name", ["q.tsv", "q.txt", "q.tsv.gz"])
def test_tsv_queries(tmp_path, name):
    path = write(tmp_path / name, "\ufeff1\tfirst query\r\n\n  \n3\t naïve “quotes” \n")
    assert read_queries(path) == [("1", "first query"), ("3", " naïve “quotes” ")]


@pytest.mark.parametrize("name", ["queries.jsonl", "queries.json", "queries.jsonl.gz"])
def test_jsonl_queries_like_beir(tmp_path, name):
    lines = [
        '{"_id": "q1", "text": "beir style", "metadata": {}}',
        '{"id": 2, "query": "int id, query field"}',
        '{"qid": "q3", "text": "qid field"}',
    ]
    assert read_queries(write(tmp_path / name, "\n".join(lines))) == [
        ("q1", "beir style"),
        ("2", "int id, query field"),
        ("q3", "qid field"),
    ]


@pytest.mark.parametrize(
    ("name", "content", "line", "message"),
    [
        ("q.tsv", "1\tok\n2\n", 2, "no text column, expected 2: qid<TAB>text"),
        ("q.tsv", "1\tok\n2\ta\tb\n", 2, "3 tab-separated columns"),
        ("q.tsv", "1\tok\n2\t  \n", 2, "query '2' has empty text"),
        ("q.tsv", "1\tok\n2\t\n", 2, "query '2' has empty text"),
        ("q.tsv", "1\tok\n\tno id\n", 2, "empty query id"),
        ("q.tsv", "1\tok\nq 2\ttext\n", 2, "query id 'q 2' contains whitespace"),
        ("q.tsv", "1\tok\n\n1\tagain\n", 3, r"duplicate query id '1' \(first on line 1\)"),
        ("q.tsv", b"1\tok\n2\tcaf\xe9\n", 2, "invalid UTF-8 at byte 6"),
        ("q.jsonl", '{"_id": "1", "text": "ok"}\n{"_id": "2", "text": \n', 2, "malformed JSON"),
        ("q.jsonl", '{"_id": "1", "text": "ok"}\n["2", "t"]\n', 2, "expected a JSON object"),
        ("q.jsonl", '{"_id": "1", "text": "ok"}\n{"text": "t"}\n', 2, "no field '_id' or 'id' or 'qid'"),
        ("q.jsonl", '{"_id": "1", "text": "ok"}\n{"_id": "2"}\n', 2, "no field 'text' or 'query'"),
        ("q.jsonl", '{"_id": "1", "text": "ok"}\n{"_id": true, "text": "t"}\n', 2, "field '_id' is bool"),
        ("q.jsonl", '{"_id": "1", "text": "ok"}\n{"_id": "2", "text": 3}\n', 2, "field 'text' is int"),
        ("q.jsonl", '{"_id": "1", "text": "ok"}\n{"_id": "1", "query": "t"}\n', 2, "duplicate query id '1'"),
    ],
)
def test_bad_query_lines(tmp_path, name, content, line, message):
    path = write(tmp_path / name, content)
    with pytest.raises(InputError, match=message) as caught:
        read_queries(path)
    assert caught.value.where == line and str(caught.value).startswith(f"{path}:{line}: ")


@pytest.mark.parametrize("reader", [read_queries, read_qrels])
@pytest.mark.parametrize("content", [b"", b"\n \n"])
def test_empty_files_are_refused(tmp_path, reader, content):
    with pytest.raises(InputError, match="^" + re.escape(str(tmp_path)) + ".*: no (queries|judgments)"):
        reader(write(tmp_path / "f.tsv", content))


@pytest.mark.parametrize("reader", [read_queries, read_qrels])
def test_unreadable_files_are_input_errors(tmp_path, reader):
    with pytest.raises(InputError, match="cannot read"):
        reader(tmp_path / "missing.tsv")
    with pytest.raises(InputError, match="cannot read"):
        reader(tmp_path)  # a directory
    truncated = tmp_path / "t.tsv.gz"
    line = "{0}\tquery {0}\n" if reader is read_queries else "{0} 0 d{0} 1\n"
    truncated.write_bytes(gzip.compress("".join(map(line.format, range(1000))).encode())[:-20])
    with pytest.raises(InputError, match="cannot read"):
        reader(truncated)


def test_trec_qrels(tmp_path):
    path = write(tmp_path / "qrels.txt", "1 0 d1 1\n1\t0\td2\t0\n\n2 Q0 d1 -1\n1 0 d1 1\n")
    assert read_qrels(path) == {"1": {"d1": 1, "d2": 0}, "2": {"d1": -1}}


def test_beir_qrels_with_header(tmp_path):
    path = write(tmp_path / "test.tsv", "query-id\tcorpus-id\tscore\nq1\td1\t1\nq1\td2\t2\n")
    assert read_qrels(path) == {"q1": {"d1": 1, "d2": 2}}


@pytest.mark.parametrize(
    ("content", "line", "message"),
    [
        ("1 0 d1 1\n1 0 d2\n", 2, "3 columns, expected 4"),
        ("1 d1 1\n1 0 d2 1\n", 2, "4 columns, expected 3"),
        ("1 0 d1 1\n1 0 d2 1 extra\n", 2, r"5 columns, expected 4"),
        ("1 d1\n", 1, r"2 columns, expected 4 \(qid 0 docid rel\) or 3 \(qid docid rel\)"),
        ("1 0 d1 1\n1 0 d2 1.0\n", 2, "relevance '1.0' is not an integer"),
        ("1 0 d1 one\n", 1, "relevance 'one' is not an integer"),
        ("1 0 d1 1\nquery-id corpus-id score\n", 2, "3 columns, expected 4"),
        ("1 0 d1 1\n1 0 d1 2\n", 2, r"\(1, d1\) judged 1 earlier, now 2"),
        (b"1 0 d1 1\n1 0 d\xff 1\n", 2, "invalid UTF-8 at byte 6"),
    ],
)
def test_bad_qrels_lines(tmp_path, content, line, message):
    path = write(tmp_path / "qrels.txt", content)
    with pytest.raises(InputError, match=message) as caught:
        read_qrels(path)
    assert caught.value.where == line and str(caught.value).startswith(f"{path}:{line}: ")


def test_scifact_topics(scifact):
    queries = read_queries(scifact / "queries.tsv")
    qrels = read_qrels(scifact / "qrels.tsv")
    assert len(queries) == len(qrels) == 300
    assert sum(map(len, qrels.values())) == 339
    assert {qid for qid, _ in queries} == set(qrels)


@pytest.mark.parametrize("header", ["qid\ttext", "query-id\ttext", "_id\ttext", "id\tquery", "QID\tQuery"])
def test_a_header_line_of_a_queries_tsv_is_skipped_with_a_notice(tmp_path, header):
    path = write(tmp_path / "q.tsv", f"\n{header}\n1\tfirst query\n")
    notices = []
    assert read_queries(path, notice=notices.append) == [("1", "first query")]
    assert notices == [f"{path}:2: skipped the header line {header.split(chr(9))[0]!r}<TAB>{header.split(chr(9))[1]!r}"]


def test_only_the_first_line_can_be_a_header(tmp_path):
    path = write(tmp_path / "q.tsv", "1\tfirst query\nqid\ttext\n")
    assert read_queries(path, notice=pytest.fail) == [("1", "first query"), ("qid", "text")]


@pytest.mark.parametrize("qid", ["q\u00a01", "q\u20281", "q\u00851", "q\u001f1", "q\x001", "q\x7f1"])
def test_query_ids_follow_the_run_file_id_rule(tmp_path, qid):
    path = write(tmp_path / "q.tsv", f"1\tok\n{qid}\ttext\n")
    with pytest.raises(InputError, match=re.escape(f"query id {qid!r} contains")) as caught:
        read_queries(path)
    assert caught.value.where == 2


@pytest.mark.parametrize("rel", ["1001", "-1001", "3000000000"])
def test_relevance_beyond_the_bound_is_refused(tmp_path, rel):
    path = write(tmp_path / "qrels.txt", f"1 0 d1 1\n1 0 d2 {rel}\n")
    with pytest.raises(InputError, match=re.escape(f"relevance {rel} is beyond ±1000")) as caught:
        read_qrels(path)
    assert caught.value.where == 2


def test_eval_of_a_huge_relevance_fails_in_bounded_memory(tmp_path):
    """ir_measures' trec_eval sizes its gain tables by the largest grade (8 bytes each): 2·10⁹ asked for 16 GB."""
    import subprocess
    import sys

    qrels = write(tmp_path / "qrels.txt", "q1 0 d1 2000000000\nq1 0 d2 1\n")
    run = write(tmp_path / "run.trec", "q1 Q0 d1 1 2.0 t\nq1 Q0 d2 2 1.0 t\n")
    capped = ("import resource, runpy, sys; resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30)); "
              "sys.argv[0] = 'lsr-index'; runpy.run_module('lsr_index', run_name='__main__')")
    done = subprocess.run([sys.executable, "-c", capped, "eval", "--run", str(run), "--qrels", str(qrels)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 1 and done.stderr == f"error: {qrels}:1: relevance 2000000000 is beyond ±1000 " \
        "(relevance is a small grade; the evaluator's memory grows with the largest one)\n", done.stderr
