"""trainer: compact Llama with pluggable HD-RoPE, data, training loop, evals, attention dumps.

Not built yet (issue 3). Depends on `hdrope`, never on Ray or `sweeps`.
"""
