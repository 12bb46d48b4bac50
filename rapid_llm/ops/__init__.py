"""Compute kernels behind small registries: a pure-torch reference for each op, faster ones later."""
