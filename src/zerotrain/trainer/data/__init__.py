"""Data preparation: files -> rows (readers) -> tokenized, cached datasets (prepare), conversations
for sft (chat, packing), tokenizers, batches (collate), and which rank trains on which sample
(sampler)."""
