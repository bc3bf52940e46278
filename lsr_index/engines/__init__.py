"""Search engines that index the encode stage's vectors: each builds an index directory from the same shards,
publishes it atomically with its record, and searches it with the queries encoded as the record says."""
