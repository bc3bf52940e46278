"""The SPLADE model: which files it is (resolved and identified once), how it loads split at its decoder, how texts
become token ids and token ids become term weights, and how queries are encoded (by the model or by its table)."""
