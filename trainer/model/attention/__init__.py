"""Attention paths: one layer's attention computed densely (the reference), by tiles with linear memory, or by
FlexAttention, chosen by the registry in `paths`; the encodings say what their scores are for one tile."""
