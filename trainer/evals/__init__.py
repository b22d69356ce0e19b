"""The evaluation stage: validation, extrapolation, passkey retrieval, lm-eval benchmarks and attention dumps."""
