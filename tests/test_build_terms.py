"""Every term is indexed exactly as the vectors hold it, whatever characters it holds: real Lucene indexes from both
builders, searched term by term and all together, against the exact integer dot product. The anserini builder,
whose fake words are split at whitespace and cut at 255 characters, refuses before writing anything the vectors it
cannot hold, naming the shard, the record and the term."""

from __future__ import annotations

import math
import re
import unicodedata
from pathlib import Path

import pytest
from test_build import search, write_vectors

from lsr_index.engines.lucene import build
from lsr_index.errors import LsrIndexError
from lsr_index.vectors.shards import SEPARATOR

pytestmark = pytest.mark.lucene

# Every whitespace class Python, Java or Unicode knows (Zs, Zl, Zp, the ASCII and C1 controls that some call
# whitespace, the no-break spaces Java does not split at, format characters nothing splits at)
WHITESPACE = ([" ", "\t", "\n", "\r", "\x0b", "\x0c", "\x1c", "\x1d", "\x1e", "\x1f", "\x85", "\xa0", "\u1680",
               "\u2028", "\u2029", "\u202f", "\u205f", "\u3000", "\u180e", "\u200b", "\ufeff", "\u2007"]
              + [chr(c) for c in range(0x2000, 0x200B)])
# the token filter's delimiter and every character a document's form may use instead; the JSON structure
DELIMITERS = ["\x01", "\x02", "\x03", "\x08", "\x0e", "\x10", "|", "^", "~", "\ue000", "\ue001"]
STRUCTURE = ['"', "\\", ":", ",", "{", "}", '":1,"', "\\u0000", "[", "]"]
CONTROLS = ["\x00", "\x07", "\x1b", "\x7f", "\x9f"]
MARKS = ["e\u0301", "\u0301", "\u0308\u0308", "\u200d", "🇫🇷", "👩\u200d💻"]
ASTRAL = ["😀", "\uf600", "\U0010ffff", "\U000e0001"]  # past 16 bits, which a Java bridge must not cut
LONG = ["x" * 255, "x" * 256, "x" * 254 + "😀", "é" * 16_383, "😀" * 8191, "a b" * 5000]


def hostile_vocabulary() -> list[str]:
    """Each hostile character alone, inside a term, and around one; the fragments a split would make, too."""
    vocab = ["a", "b", "ab", "plain"]
    for c in WHITESPACE + DELIMITERS + STRUCTURE + CONTROLS + MARKS + ASTRAL:
        vocab += [c, f"a{c}b", f"{c}{c}a"]
    vocab += LONG
    return list(dict.fromkeys(vocab))


VOCAB = hostile_vocabulary()


def hostile_docs(vocab: list[str], per_doc: int = 9) -> list[tuple[str, dict[int, int]]]:
    """Documents of `per_doc` terms each, every term in some document, impacts all distinct (no ties to break)."""
    docs, impact = [], 0
    for start in range(0, len(vocab), per_doc - 2):
        terms = [*range(start, min(start + per_doc - 2, len(vocab))), 0, 1]  # "a" and "b" everywhere
        vector = {}
        for t in dict.fromkeys(terms):
            impact += 1
            vector[t] = impact
        docs.append((f"d{len(docs)}", vector))
    return docs


def exact(query: dict[str, int], vocab: list[str], docs: list[tuple[str, dict[int, int]]]) -> dict[str, int]:
    column = {term: i for i, term in enumerate(vocab)}
    scores = {d: sum(w * v.get(column[t], 0) for t, w in query.items()) for d, v in docs}
    return {d: s for d, s in scores.items() if s}


def check_searches(index: Path, vocab: list[str], docs: list[tuple[str, dict[int, int]]]) -> None:
    """Each term alone, and every term at once: the documents found and their scores are the exact dot product's
    (float32 sums; Anserini nudges tied scores apart by 1e-6 of a score)."""
    queries = [(f"q{i}", {term: 3}) for i, term in enumerate(vocab)]
    queries.append(("q-all", {term: 1 + i % 7 for i, term in enumerate(vocab)}))
    ranked = search(index, queries, hits=1000)
    for qid, query in queries:
        want = exact(query, vocab, docs)
        got = dict(ranked[qid])
        assert set(got) == set(want), (qid, query, got, want)
        for doc, score in got.items():
            assert math.isclose(score, want[doc], rel_tol=1e-5), (qid, query, doc, score, want[doc])


@pytest.mark.parametrize("fmt", ["jsonl", "jsonl.gz", "parquet"])
def test_the_direct_builder_indexes_every_term_as_written(tmp_path, fmt):
    docs = hostile_docs(VOCAB)
    write_vectors(tmp_path / "vectors", VOCAB, docs, fmt, shard_docs=40)
    info = build.build_index(tmp_path / "vectors", tmp_path / "index", threads=1, heap="1g", progress=False)
    assert info.documents == len(docs)
    check_searches(tmp_path / "index", VOCAB, docs)


def test_whitespace_inside_a_term_never_splits_it_into_others(tmp_path):
    """A term holding whitespace is one term: a query for 'a b' finds exactly the documents holding 'a b', at their
    weight. Split into fragments, it would find the documents holding 'a' or 'b' instead, and 'a b' itself at 0."""
    vocab = ["a b", "a", "b", "a\u3000b", "a\nb"]
    docs = [("whole", {0: 5}), ("parts", {1: 7, 2: 11}), ("ideographic", {3: 13}), ("newline", {4: 17})]
    write_vectors(tmp_path / "vectors", vocab, docs, "jsonl.gz")
    build.build_index(tmp_path / "vectors", tmp_path / "index", heap="1g", progress=False)
    ranked = search(tmp_path / "index", [("q", {"a b": 1}), ("qa", {"a": 1}), ("q3000", {"a\u3000b": 2}),
                                         ("qn", {"a\nb": 1})])
    assert ranked == {"q": [("whole", 5.0)], "qa": [("parts", 7.0)], "q3000": [("ideographic", 26.0)],
                      "qn": [("newline", 17.0)]}


def anserini_holds(term: str) -> bool:
    """Whether Anserini's fake words keep `term` whole: no Java whitespace, at most 255 UTF-16 units before its last
    character (the independent statement of the rule the builder enforces)."""
    java_space = any(c in "\t\n\x0b\x0c\r\x1c\x1d\x1e\x1f" or (unicodedata.category(c) in ("Zs", "Zl", "Zp")
                                                            and c not in "\xa0\u2007\u202f") for c in term)
    return bool(term) and not java_space and len(term[:-1].encode("utf-16-le")) // 2 < 255


@pytest.mark.slow
@pytest.mark.parametrize("fmt", ["jsonl.gz", "parquet"])
def test_both_builders_index_what_anserini_holds_identically(tmp_path, fmt):
    """The hostile terms that Anserini's fake words keep whole (control characters, delimiters, JSON's own
    characters, combining marks, characters beyond U+FFFF, 255-unit terms): both builders give the exact dot
    product, and the same rankings."""
    vocab = [t for t in VOCAB if anserini_holds(t)]
    assert len(vocab) > 100 and "x" * 254 + "😀" in vocab and "x" * 256 not in vocab
    docs = hostile_docs(vocab)
    for doc in docs:  # fake words cost a token per unit of impact: keep the sums small
        doc[1].update({t: 1 + w % 50 for t, w in doc[1].items()})
    write_vectors(tmp_path / "vectors", vocab, docs, fmt, shard_docs=40)
    for builder in ("direct", "anserini"):
        build.build_index(tmp_path / "vectors", tmp_path / builder, builder=builder, threads=1, heap="1g",
                          progress=False)
        check_searches(tmp_path / builder, vocab, docs)
    queries = [(f"q{i}", {term: 1 + i % 3, vocab[(i * 7) % len(vocab)]: 2}) for i, term in enumerate(vocab)]
    assert search(tmp_path / "direct", queries) == search(tmp_path / "anserini", queries)


@pytest.mark.parametrize("term", [t for t in [*WHITESPACE, "x" * 256, "a b" * 5000, ""] if not anserini_holds(t)]
                         + ["a\tb", "a\u3000b", "x" * 300])
def test_the_anserini_builder_refuses_a_term_it_would_split_before_writing(tmp_path, term, monkeypatch):
    """One line naming the shard and line, the record and the term; Anserini never starts."""
    monkeypatch.setattr(build, "_stage_input", lambda *a: pytest.fail("Anserini's input was staged"))
    write_vectors(tmp_path / "vectors", ["a", term], [("fine", {0: 1}), ("d1", {0: 2, 1: 3})], "jsonl")
    shard = tmp_path / "vectors" / "shards" / "part-00000.jsonl"
    with pytest.raises(LsrIndexError) as refused:
        build.build_index(tmp_path / "vectors", tmp_path / "index", builder="anserini", progress=False)
    line = str(refused.value)
    assert "\n" not in line and line.startswith(f"{shard}:2: record 'd1' holds "), line
    assert "term" in line and line.endswith("build with --builder direct (the default), which indexes every term "
                                            "exactly; nothing was published")
    assert not (tmp_path / "index").exists()


def test_the_anserini_builder_refuses_an_impact_it_would_read_otherwise(tmp_path):
    write_vectors(tmp_path / "vectors", ["a", "b"], [("big", {0: 2**31 - 1, 1: 5})], "parquet")
    with pytest.raises(LsrIndexError, match=re.escape("row 1: record 'big' holds impacts summing to 2,147,483,652, "
                                                      "past Lucene's 2,147,483,647 tokens a document")):
        build.build_index(tmp_path / "vectors", tmp_path / "index", builder="anserini", progress=False)


def test_the_separator_is_a_space_only_for_documents_whose_terms_hold_none(tmp_path):
    """The fast path's form is kept for ordinary documents: a term with a space moves only its own document to
    another separator."""
    from lsr_index.vectors.shards import FORM, ShardRange, read_joined

    write_vectors(tmp_path / "vectors", ["a", "b c", "d"], [("plain", {0: 1, 2: 2}), ("spaced", {1: 3, 0: 1})],
                  "jsonl")
    shard = tmp_path / "vectors" / "shards" / "part-00000.jsonl"
    plain, spaced = read_joined(ShardRange(str(shard), 0, 2, 2))
    assert plain == ("plain", f"a\x011{SEPARATOR}d\x012", FORM, 2)
    separator, delimiter = spaced[2]
    assert separator not in "ab cd" and spaced[1] == f"a{delimiter}1{separator}b c{delimiter}3" and spaced[3] == 2
