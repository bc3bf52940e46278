"""Regenerate data/sample from BEIR SciFact (../shared/data/scifact): the first 60 test queries, every
document they judge relevant, and unjudged documents up to 400 in all, in corpus order."""

import json
import random
import sys
from pathlib import Path

source = Path(sys.argv[1] if len(sys.argv) > 1 else "../shared/data/scifact")
target = Path(__file__).parent / "sample"
target.mkdir(exist_ok=True)
queries = source.joinpath("queries.tsv").read_text().splitlines()[:60]
qids = {line.split("\t")[0] for line in queries}
qrels = [line for line in source.joinpath("qrels.tsv").read_text().splitlines() if line.split()[0] in qids]
relevant = {line.split()[2] for line in qrels}
corpus = source.joinpath("corpus.jsonl").read_text().splitlines()
ids = [json.loads(line)["id"] for line in corpus]
others = [i for i, doc_id in enumerate(ids) if doc_id not in relevant]
keep = set(random.Random(13).sample(others, 400 - len(relevant)))
docs = [line for i, line in enumerate(corpus) if i in keep or ids[i] in relevant]
assert len(docs) == 400, len(docs)
target.joinpath("corpus.jsonl").write_text("\n".join(docs) + "\n")
target.joinpath("queries.tsv").write_text("\n".join(queries) + "\n")
target.joinpath("qrels.tsv").write_text("\n".join(qrels) + "\n")
