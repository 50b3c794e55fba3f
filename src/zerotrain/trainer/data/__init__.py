"""Data preparation: files -> rows (readers) -> tokenized, cached datasets (prepare), tokenizers,
batches (collate), and which rank trains on which sample (sampler)."""
