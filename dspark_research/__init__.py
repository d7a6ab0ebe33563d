"""dspark-compile's research code, kept in the source checkout and out of the wheel.

The acceptance study, training and HF export of the byte-level pairs, the speculative
decoding loop (:mod:`dspark_research.speculative`), the demo's acceptance part
(:mod:`dspark_research.pair_demo`), results provenance (:mod:`dspark_research.provenance`)
and their commands (``python -m dspark_research``, run from the checkout root). It builds
on :mod:`dspark_compile`; ``dspark_compile`` never imports it.
"""
