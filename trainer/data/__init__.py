"""The data stage: corpora, tokenizers, verified token shards, deterministic batches and passkey prompts."""
