"""Seismic (Bruch, Nardini, Rulli, Venturini, SIGIR 2024; PyPI pyseismic-lsr): approximate top-k over learned sparse
vectors through clustered inverted lists with summaries, built from the same shards and integer impacts as the
Lucene index. The scores it returns are the exact integer dot products of the documents it finds; which documents
it finds depends on SeismicBuild and SeismicSearch (options.py).

build.py builds and publishes an index, searcher.py searches it, layout.py names and checks its files. Nothing is
imported here, so that the command line reads the options' ranges without loading the engine.
"""
