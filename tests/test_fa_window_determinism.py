"""``benchmarks/fa_window_determinism.py`` off the GPU: its fp32 reference is the windowed
causal attention (checked against SDPA with a position mask on contiguous keys), its
inputs are paged as FA3 reads them, and bad options are named."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))

import fa_window_determinism as fwd  # noqa: E402


@pytest.mark.parametrize("seq_len,q_len,left", [(40, 1, 10), (40, 6, 10), (37, 6, -1), (5, 5, 12)])
def test_reference_is_windowed_causal_attention(seq_len, q_len, left):
    batch = 2
    q, k_cache, v_cache, table, cu_q, seqused = fwd.paged_inputs(batch, seq_len, q_len, "cpu", 3)
    assert table.shape == (batch, -(-seq_len // fwd.BLOCK)) and table.dtype == torch.int32
    assert cu_q.tolist() == [0, q_len, 2 * q_len] and seqused.tolist() == [seq_len] * batch
    assert len(set(table.flatten().tolist())) == table.numel()  # no block shared
    got = fwd.reference(q, k_cache, v_cache, table, seq_len, q_len, left)
    group = fwd.HQ // fwd.HKV
    for b in range(batch):
        rows = [k_cache[i] for i in table[b].tolist()]
        k = torch.cat(rows)[:seq_len].float().repeat_interleave(group, dim=1)
        rows = [v_cache[i] for i in table[b].tolist()]
        v = torch.cat(rows)[:seq_len].float().repeat_interleave(group, dim=1)
        pos = torch.arange(seq_len - q_len, seq_len)[:, None]
        key = torch.arange(seq_len)[None, :]
        mask = (key <= pos) & ((key >= pos - left) if left >= 0 else True)
        qb = q[b * q_len : (b + 1) * q_len].float().transpose(0, 1)
        want = F.scaled_dot_product_attention(qb, k.transpose(0, 1), v.transpose(0, 1), mask)
        torch.testing.assert_close(got[b * q_len : (b + 1) * q_len], want.transpose(0, 1))
    assert got.abs().sum() > 0


def test_bad_repeats_is_named(capsys):
    with pytest.raises(SystemExit):
        fwd.main(["--repeats", "1"])
    assert "--repeats: 1: expected an int >= 2" in capsys.readouterr().err


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message off the GPU")
def test_needs_a_gpu(capsys):
    assert fwd.main(["--repeats", "2"]) == 2
    assert "needs a CUDA GPU" in capsys.readouterr().err
