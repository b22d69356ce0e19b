"""Passkey retrieval: prompts in the LongRoPE format (training mixture and evaluation)."""
