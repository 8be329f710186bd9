"""Metrics (perplexity, I(W), cosine statistics, spectra), evaluation, and table rendering."""
