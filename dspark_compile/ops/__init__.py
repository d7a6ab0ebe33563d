"""Custom ops in the ``dspark`` torch.library namespace (importing registers them)."""

from dspark_compile.ops import (
    markov_sampling,  # noqa: F401  (dspark::markov_head_sample)
    paged_attention,  # noqa: F401  (registers dspark::*)
    sparse_mla,  # noqa: F401  (registers dspark::* sparse MLA)
)
