"""Small reference draft models with random weights (no downloads)."""

from dspark_compile.kernels.markov_sampling import gumbel_noise
from dspark_compile.models.dflash_draft import DFlashReferenceDraft, DraftModelConfig
from dspark_compile.models.dspark_draft import (
    DSparkDraftConfig,
    DSparkReferenceDraft,
    random_latent_caches,
)
from dspark_compile.models.markov_sampling import (
    DSparkMarkovHead,
    block_sample_indices,
    sample_sequential,
)
from dspark_compile.models.paged_batch import PagedBatch, make_paged_batch, random_kv_cache

__all__ = [
    "DFlashReferenceDraft",
    "DSparkDraftConfig",
    "DSparkMarkovHead",
    "DSparkReferenceDraft",
    "DraftModelConfig",
    "PagedBatch",
    "random_latent_caches",
    "block_sample_indices",
    "gumbel_noise",
    "make_paged_batch",
    "random_kv_cache",
    "sample_sequential",
]
