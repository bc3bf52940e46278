"""The encode stage's output: impact vectors quantized from term weights, written as checksummed shards (Anserini
JsonVectorCollection or Parquet) and listed in a manifest that every later stage reads."""
