"""Kernels and their torch references (the definition of correct), per op."""
