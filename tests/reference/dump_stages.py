#!/usr/bin/python3
"""Writes the reference's intermediate tensors for one prompt (one prefill pass) to a
safetensors file, so an engine can be diffed stage by stage (DeepSeek / Step-3 models).

    dump_stages.py MODEL_DIR IDS OUT.safetensors      (IDS: comma-separated token ids)

Tensors (F32, first dimension = prompt position):
  layer{l}.mla_c_n [n, kv_lora_rank], layer{l}.mla_k_pe_rot [n, qk_rope_head_dim]   (MLA cache)
  layer{l}.after_attention [n, hidden], layer{l}.after_ffn [n, hidden]         (residual stream)
  layer{l}.router_idx [n, k] (I32), layer{l}.router_weights [n, k]                (MoE layers)
  final_hidden [n, hidden] (after model.norm), logits [n, vocab]
Router rows list the chosen experts in descending order of the score the choice compares.
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import mla_mfa_ref as ref  # noqa: E402
import safetensors_io as st  # noqa: E402


def stages(model, ids):
    """-> {name: st.Tensor} for one prefill of `ids` through `model` (a mla_mfa_ref.Model)."""
    model.trace = []
    logits = model.forward([(model.new_sequence(), ids)])[0]
    out = {}
    for layer, name, a in model.trace:
        key = name if layer is None else f"layer{layer}.{name}"
        out[key] = st.Tensor("I32", a) if name == "router_idx" else st.Tensor.from_float(a, "F32")
    out["logits"] = st.Tensor.from_float(logits, "F32")
    model.trace = None
    return out


def main():
    if len(sys.argv) != 4:
        print(__doc__, file=sys.stderr)
        sys.exit(2)
    model_dir, ids, path = sys.argv[1:]
    try:
        model = ref.Model.from_dir(model_dir)
        ids = [int(x) for x in ids.split(",") if x.strip()]
        tensors = stages(model, ids)
    except (ValueError, OSError) as e:
        print(f"dump_stages: {e}", file=sys.stderr)
        sys.exit(2)
    st.write_file(path, tensors)
    print(f"{len(tensors)} tensors for {len(ids)} positions -> {path}")


if __name__ == "__main__":
    main()
