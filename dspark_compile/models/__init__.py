"""Small reference draft models with random weights (no downloads)."""

from dspark_compile.models.dflash_draft import DFlashReferenceDraft, DraftModelConfig
from dspark_compile.models.paged_batch import PagedBatch, make_paged_batch, random_kv_cache

__all__ = ["DFlashReferenceDraft", "DraftModelConfig", "PagedBatch", "make_paged_batch",
           "random_kv_cache"]
