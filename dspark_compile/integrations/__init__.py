"""Integrations with vLLM, depyf and other hosts."""
