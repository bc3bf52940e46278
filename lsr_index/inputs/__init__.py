"""What the user hands in: corpus files (JSONL, Arrow, Parquet, compressed or not) read as (id, text) batches, and
the queries and relevance judgments of a search."""
