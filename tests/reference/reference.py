"""Picks the reference implementation for a model directory by its config.json model_type:
hf_moe_ref (qwen3_moe, qwen2_moe, mixtral) or mla_mfa_ref (deepseek_v2, deepseek_v3, kimi_k2,
step3_text, step3_vl). Both expose the same Model interface (forward, new_sequence, cfg)."""

import json
import os

import numpy as np

import hf_moe_ref
import mla_mfa_ref


def module_for(config):
    """config.json dict -> the reference module that implements it."""
    return mla_mfa_ref if mla_mfa_ref.is_supported(config) else hf_moe_ref


def config_of(model_dir):
    with open(os.path.join(model_dir, "config.json")) as f:
        return json.load(f)


def load_model(model_dir, dtype=np.float64):
    return module_for(config_of(model_dir)).Model.from_dir(model_dir, dtype)


def build_model(config, tensors, dtype=np.float64):
    """config.json dict + {name: st.Tensor} -> Model."""
    m = module_for(config)
    return m.Model(m.Config(config), tensors, dtype)
