"""One step of the online (streaming) softmax shared by the sparse-MLA Triton kernels."""

import triton
import triton.language as tl


@triton.jit
def online_softmax_step(m_i, l_i, acc, scores, values, PRECISION: tl.constexpr):
    """Fold one tile into the running state: ``scores [R, N]`` (``-inf`` where masked),
    ``values [N, L]``; ``m_i [R]`` running max, ``l_i [R]`` running sum of ``exp(s - m_i)``,
    ``acc [R, L]`` running ``sum(exp(s - m_i) * v)``. A row whose scores are all ``-inf`` so
    far keeps ``l_i = 0`` and ``acc = 0``. Returns ``(m_i, l_i, acc)``."""
    m_new = tl.maximum(m_i, tl.max(scores, axis=1))
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
    p = tl.exp(scores - m_safe[:, None])
    alpha = tl.exp(m_i - m_safe)
    l_i = l_i * alpha + tl.sum(p, axis=1)
    acc = acc * alpha[:, None] + tl.dot(p.to(values.dtype), values, input_precision=PRECISION)
    return m_new, l_i, acc
