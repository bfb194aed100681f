"""Recursive drafting with DeepSeek's MTP module (MODELS.md B7), in the float64 reference
(mla_mfa_ref.Model loaded with load_mtp=True): what a speculative decoder with k drafts per step
proposes at each position of a known token sequence.

At position i of tokens t[0..T) with the main model's final-normed hidden states h[i], and the
module's cache holding the true positions 0..i-1:
  step 1: the module at position i on (h[i], t[i+1])   -> logits -> d1 = argmax, block output b1
  step j: the module at position i+j-1 on (b[j-1], d[j-1]) -> d[j], b[j]        (j = 2..k)
b[j] is the module's decoder-layer output, the residual stream before shared_head.norm (the
module applies hnorm to it as it does to h). Then the speculative positions i+1.. are dropped
from the module's cache, so that position i+1 is computed next from true inputs. argmax takes
the lowest id on ties (numpy's first maximum).
"""

import numpy as np


def argmax_margin(row):
    """-> (argmax with the lowest id on ties, top-1 minus top-2 logit)."""
    d = int(np.argmax(row))
    s = np.sort(row)
    return d, float(s[-1] - s[-2])


def recursive_drafts(model, tokens, hidden, k, feed=None):
    """tokens [T] the true tokens, hidden [T, H] the main model's final-normed hidden states at
    their positions (Model.forward(..., return_hidden=True)). -> (drafts, margins), one list of k
    per position i = 0..T-2 (each needs the true t[i+1]). feed(z, logits) -> the hidden input of
    the next step, the block output z by default (another rule only to show that the golden
    tells them apart)."""
    if model.mtp is None:
        raise ValueError("the model was loaded without its MTP module (load_mtp=True)")
    T = len(tokens)
    hidden = np.asarray(hidden)
    if hidden.shape[0] != T:
        raise ValueError(f"{T} tokens with {hidden.shape[0]} hidden rows")
    seq = model.new_mtp_sequence()
    drafts, margins = [], []
    for i in range(T - 1):
        assert seq.length == i
        h, t = hidden[i:i + 1], int(tokens[i + 1])
        ds, ms = [], []
        for _ in range(k):
            logits, z = model.mtp_forward(seq, h, [t], return_block=True)
            d, m = argmax_margin(logits[0])
            ds.append(d)
            ms.append(m)
            h, t = (z if feed is None else feed(z, logits)), d
        seq.truncate(i + 1)
        drafts.append(ds)
        margins.append(ms)
    return drafts, margins
