"""Shared building blocks that model files are assembled from."""
