"""The model stage: the compact Llama, its arguments, the encodings and their registry, generation and FLOPs."""
