"""Compile routes the ``dspark`` backend dispatches to besides Inductor: torchair (Ascend).

The vLLM route is ``dspark_compile.integrations.vllm`` (it imports vLLM).
"""
