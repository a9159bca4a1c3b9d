"""The hf engine's in-place cache layer: the same keys, values and logits as transformers'
concatenating `DynamicLayer`, across buffer growth and regrouping."""

from __future__ import annotations

import pytest
import torch
from transformers.cache_utils import DynamicLayer

from legorl.engine.hf import load_model
from legorl.engine.kv_batch import BatchedForward, GrowingLayer, regroup
from legorl.model_families import save


def test_growing_layer_holds_what_concatenation_holds_across_growth() -> None:
    gen = torch.Generator().manual_seed(0)
    grown, plain = GrowingLayer(), DynamicLayer()
    widths = [5, 1, GrowingLayer.HEADROOM + 3] + [1] * 40  # the third outgrows the first buffer
    buffers = set()
    for n in widths:
        k, v = torch.randn(2, 3, n, 4, generator=gen), torch.randn(2, 3, n, 4, generator=gen)
        gk, gv = grown.update(k, v)
        pk, pv = plain.update(k, v)
        assert torch.equal(gk, pk) and torch.equal(gv, pv)
        buffers.add(grown._keys_buf.data_ptr())
    assert grown.get_seq_length() == sum(widths)
    assert len(buffers) >= 2, "the buffer never grew: the test did not cross a growth"
    assert len(buffers) < len(widths) // 4, "the buffer was reallocated on most updates: not in place"


def test_row_selection_and_cropping_act_as_on_a_dynamic_layer() -> None:
    gen = torch.Generator().manual_seed(1)
    grown, plain = GrowingLayer(), DynamicLayer()
    k, v = torch.randn(3, 2, 9, 4, generator=gen), torch.randn(3, 2, 9, 4, generator=gen)
    grown.update(k, v)
    plain.update(k, v)
    for layer in (grown, plain):
        layer.batch_select_indices(torch.tensor([2, 0]))
        layer.crop(-3)
    assert grown.get_seq_length() == plain.get_seq_length() == 6
    assert torch.equal(grown.keys, plain.keys) and torch.equal(grown.values, plain.values)
    k2, v2 = torch.randn(2, 2, 1, 4, generator=gen), torch.randn(2, 2, 1, 4, generator=gen)
    gk, gv = grown.update(k2, v2)
    pk, pv = plain.update(k2, v2)
    assert torch.equal(gk, pk) and torch.equal(gv, pv)
    with pytest.raises(ValueError, match="crop"):
        grown.crop(2)


@pytest.mark.parametrize("model", ["tiny-qwen3", "qwen3_5"])
def test_decode_through_growing_layers_equals_a_full_forward(model: str, tmp_path) -> None:
    """Prefill 3 rows, decode past a buffer growth, drop a row, decode on: every step's logits
    equal a fresh unbatched forward of that row's whole sequence."""
    torch.manual_seed(0)
    path = model if model.startswith("tiny-") else str(save(model, tmp_path / model))  # qwen3_5: hybrid layers
    net = load_model(path, "cpu", "float32", "sdpa")
    fwd = BatchedForward(net)
    seqs = [[int(t) for t in torch.randint(3, 200, (n,))] for n in (7, 12, 4)]
    batch, logits_B_V = fwd.prefill(seqs)
    kinds = {type(layer) for layer in batch.cache.layers}
    assert GrowingLayer in kinds and DynamicLayer not in kinds  # full-attention layers grow in place
    rows = list(range(3))
    for step in range(GrowingLayer.HEADROOM + 20):
        if step == 30:
            batch, rows = regroup([(batch, [0, 2])]), [0, 2]
            logits_B_V = logits_B_V[[0, 2]]
        nxt = logits_B_V.argmax(-1).tolist()
        for r, tok in zip(rows, nxt, strict=True):
            seqs[r].append(tok)
        logits_B_V = fwd.decode(batch, nxt, [len(seqs[r]) - 1 for r in rows])
        if step % 37 == 0 or step == GrowingLayer.HEADROOM + 19:
            for i, r in enumerate(rows):
                with torch.no_grad():
                    ref_V = net(input_ids=torch.tensor([seqs[r]])).logits[0, -1]
                assert torch.allclose(logits_B_V[i], ref_V, atol=1e-4), (model, step, r)
