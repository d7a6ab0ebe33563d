"""Top-level handle for vLLM's ``compilation_config.inductor_passes`` qualnames.

vLLM (0.26-0.33) resolves a qualname ``"a.b.name"`` as ``__import__("a.b").__dict__["name"]``,
i.e. in the TOP-LEVEL package's namespace, and keeps a pass's own ``uuid()``
only for ``InductorPass`` instances. ``dspark_compile`` must import without
vLLM, so the ready-made instance lives here, in a separate top-level package
of the same distribution whose import imports vLLM::

    compilation_config={"inductor_passes":
                        {"post_grad_custom_post_pass": "dspark_compile_vllm.draft_window_pass"},
                        "splitting_ops": []}
    additional_config={"draft_window_size": 2048}
"""

from dspark_compile.integrations.vllm import DraftWindowInductorPass
from dspark_compile.integrations.vllm.versions import check_vllm_version

check_vllm_version()

#: Reads draft_window_size / method / num_speculative_tokens from the VllmConfig.
draft_window_pass = DraftWindowInductorPass()

__all__ = ["DraftWindowInductorPass", "draft_window_pass"]
