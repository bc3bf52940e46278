"""A vocabulary holding whitespace is indexed term for term (no longer refused whole); one holding a term Lucene
cannot index (empty, over 32,766 UTF-8 bytes) is refused naming that term; the serializer processes receive every
term as it is."""

from __future__ import annotations

import numpy as np
import pytest

from lsr_index.errors import LsrIndexError
from lsr_index.vectors.quantize import SparseVectors
from lsr_index.vectors.serializers import SerializerPool
from lsr_index.vectors.shards import check_vocab, serialize

SPACED = ["plain", "a b", "tab\there", "line\nbreak", "\u3000", "\u2028", "\xa0", "\x85", "\r\n", "\x00", "😀"]


def test_whitespace_and_control_characters_are_terms_like_any_other():
    check_vocab(SPACED)


@pytest.mark.parametrize(("term", "named"), [
    ("", "the empty term"),
    ("é" * 16_384, "the term 'éééééééééééééééééééééééééééééééééééééééé'… (16,384 characters) of 32,768 UTF-8 bytes, "
                   "over Lucene's limit of 32,766"),
])
def test_a_term_lucene_cannot_index_refuses_the_vocabulary_naming_it(term, named):
    with pytest.raises(LsrIndexError) as caught:
        check_vocab(["a", term, "b"])
    assert str(caught.value) == (f"the model's vocabulary holds {named}, which Lucene cannot index as a term (the "
                                 "model's tokenizer is damaged or not a SPLADE tokenizer)")
    check_vocab(["a", "é" * 16_383, "b"])  # 32,766 bytes: Lucene's largest


@pytest.mark.parametrize("fmt", ["jsonl", "jsonl.gz"])
def test_the_serializer_processes_get_every_term_as_it_is(fmt):
    """The vocabulary goes to them whole, not joined by newlines, where a term holding one would shift every later
    term."""
    vocab = np.array(SPACED, dtype=object)
    vectors = SparseVectors(np.array([0, 4, 11], np.int64), np.array([0, 1, 2, 3, *range(11)], np.int32),
                            np.arange(1, 16, dtype=np.int32))
    pool = SerializerPool(1, SPACED)
    try:
        assert pool.submit(["d0", "d1"], vectors, fmt).result(timeout=60) == serialize(["d0", "d1"], vectors,
                                                                                       vocab, fmt)
    finally:
        pool.close()
