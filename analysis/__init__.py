"""analysis: effective attention rank, Fourier attention magnitudes, theory curves, tables, figures.

Not built yet (issue 5). Reads stored results; never needs a live trial.
"""
