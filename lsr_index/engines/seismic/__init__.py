"""Seismic (Bruch, Nardini, Rulli, Venturini, SIGIR 2024; PyPI pyseismic-lsr): approximate top-k over learned sparse
vectors through clustered inverted lists with summaries, built from the same shards and integer impacts as the
Lucene index. The scores it returns are the exact integer dot products of the documents it finds; which documents
it finds depends on SeismicBuild and SeismicSearch (see options.py)."""

from lsr_index.engines.seismic.build import build_index, verify
from lsr_index.engines.seismic.options import SeismicBuild, SeismicSearch
from lsr_index.engines.seismic.searcher import Searcher

__all__ = ["Searcher", "SeismicBuild", "SeismicSearch", "build_index", "verify"]
