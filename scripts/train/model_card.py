"""Writes a shipped model's card (README.md) from its config, training metrics and the
measurements of scripts/train/package.sh.

  /usr/bin/python3 scripts/train/model_card.py --model DIR --results RESULTS_DIR > DIR/README.md
"""

import argparse
import datetime
import json
import os


def load(path):
    with open(path) as f:
        return json.load(f)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--results", required=True)
    a = ap.parse_args()
    cfg = load(os.path.join(a.model, "config.json"))
    tr = load(os.path.join(a.model, "training.json"))
    r = {k: load(os.path.join(a.results, f"{k}.json")) for k in ("eval_reference", "eval_fast", "eval_fp8", "chat")}
    step3 = cfg["model_type"] == "step3_vl"
    t = cfg.get("text_config", cfg)
    name = os.path.basename(os.path.normpath(a.model))
    size = sum(os.path.getsize(os.path.join(a.model, f)) for f in os.listdir(a.model) if f.endswith(".safetensors"))
    ref, fast, fp8 = r["eval_reference"], r["eval_fast"], r["eval_fp8"]
    uni = tr["unigram_ppl"]
    p = print
    p(f"# {name}: a tiny {'Step-3' if step3 else 'DeepSeek-V3'}-layout model trained on WordNet\n")
    p("A language model small enough to ship in the repository and train on two CPU cores, so that afd has a "
      "model that speaks on a machine that can download none. It answers dictionary questions and continues "
      "English sentences in the style of WordNet glosses; with about "
      f"{tr['params'] / 1e6:.1f} M parameters and a dictionary-sized corpus it is **often wrong**: it writes "
      "plausible definitions, not true ones. Do not use it for anything but testing and demonstrating afd.\n")
    p("## Architecture\n")
    if step3:
        p(f"Step-3 layout (`step3_vl` config with `text_config`, model_type `step3_text`): MFA attention "
          f"(one K/V head of {t['head_dim']}, {t['num_attention_heads']} query heads, low-rank query "
          f"{t['share_q_dim']}), {t['num_hidden_layers']} layers of which {t['moe_layers_enum']} are MoE "
          f"({t['moe_num_experts']} experts of {t['moe_intermediate_size']}, top-{t['moe_top_k']} softmax routing, "
          f"a shared expert of {t['share_expert_dim']}), dense layers of {t['intermediate_size']}, hidden "
          f"{t['hidden_size']}, vocabulary {t['vocab_size']}.\n")
    else:
        p(f"DeepSeek-V3 layout (`deepseek_v3`): MLA attention ({t['num_attention_heads']} heads, q_lora_rank "
          f"{t['q_lora_rank']}, kv_lora_rank {t['kv_lora_rank']}, nope/rope/v head dims {t['qk_nope_head_dim']}/"
          f"{t['qk_rope_head_dim']}/{t['v_head_dim']}), {t['num_hidden_layers']} layers, the first dense "
          f"({t['intermediate_size']}), the others MoE ({t['n_routed_experts']} routed experts of "
          f"{t['moe_intermediate_size']} in {t['n_group']} groups, top-{t['num_experts_per_tok']} from "
          f"{t['topk_group']} groups, sigmoid scores with a correction bias (`noaux_tc`), routed_scaling_factor "
          f"{t['routed_scaling_factor']}, {t['n_shared_experts']} shared expert), hidden {t['hidden_size']}, "
          f"vocabulary {t['vocab_size']}, and **one MTP layer** (`num_nextn_predict_layers: 1`, layer id "
          f"{t['num_hidden_layers']}) trained to predict the token after next.\n")
    p(f"{tr['params']:,} parameters (the MTP layer's copies of the embedding and head included), "
      f"{size / 1e6:.1f} MB of bf16 safetensors. Tokenizer: byte-level BPE, {t['vocab_size']} tokens "
      "(256 bytes, the merges learned on the training text, six special tokens `<|bos|>` `<|eos|>` `<|user|>` "
      "`<|assistant|>` `<|system|>` `<|pad|>`), `add_bos_token: true`, a chat template "
      "`<|bos|><|user|>question<|assistant|>answer<|eos|>`.\n")
    p("## Data and license\n")
    p("WordNet 3.0 (Princeton University), from Debian's `wordnet-base` package; its license (`LICENSE-WordNet` "
      "beside this card) permits use, copying, modification and distribution for any purpose with the notice "
      "kept. Every synset gives documents: a dictionary entry (`harbor (noun): a sheltered port ... Example: "
      "...`), its example sentences, and chat pairs (\"What does W mean?\" / \"What is the meaning of W?\" / "
      "\"Define W.\" answered with the gloss; \"Use W in a sentence.\" answered with an example). Synsets whose "
      "first lemma's MD5 is 0 mod 25 are held out: none of their documents is trained on. `eval.txt` holds the "
      "held-out entries and sentences (documents separated by blank lines), `chat_eval.json` 20 held-out nouns "
      "for the chat check, `eval-sample.txt` the first 300 held-out documents (the tests' sample).\n")
    p("## Training\n")
    first = tr.get("first_phase", tr)
    p(f"`scripts/train-model.sh` (PyTorch on CPU, float32): {first['steps']} AdamW steps of "
      f"{first['batch_tokens']} tokens (32 sequences of 128, packed documents), "
      f"{first['training_tokens_seen'] / 1e6:.2f} M tokens seen of {first['training_tokens_total'] / 1e6:.2f} M in "
      f"the corpus, learning rate 3e-3 with warm-up and cosine decay, seed {first['seed']}, {first['threads']} "
      f"thread; {first['train_seconds'] / 60:.0f} minutes of wall time on a 2-vCPU VM shared with the other "
      "model's training (and, for the shipped weights, with C++ builds). Loss: next-token cross-entropy"
      + ("" if step3 else " + 0.3 x the MTP module's cross-entropy on the token after next (its input: the "
         "main model's final-normed hidden state and the next token's embedding)")
      + "; routing balanced as DeepSeek-V3 does (auxiliary-loss-free bias updates, 1e-3 per step, and a 1e-4 "
      "sequence-wise balance loss).\n")
    if "first_phase" in tr:
        p("A second phase (the end of `scripts/train-model.sh`; docs/TRAINING.md \"Teaching the default model to "
          "copy\") continued that checkpoint in three stages (300, 100 and 150 steps, 2 threads) so that the model "
          "repeats text from far back in its prompt, which prompt-lookup drafting (`--speculative ngram`) needs: "
          "beside the text rows, each step held rows of 512 or 1,024 tokens packed with `[bos] A R B \\n\\n R "
          "[eos]` (R runs of 1-4 consecutive training words, up to 160 or 400 ids; A and B 0-128 or 0-256 ids of "
          "training text, so that only matching ids finds where the copy continues), scored on the repeat only, "
          "and a loss on the attention of three heads over them: layer 0 head 0 and layer 1 head 0 on the "
          "previous position, layer 2 head 1 (an induction head) on the position after the current id's first "
          "occurrence. The third stage added rows of one training document each, from its bos, "
          f"{tr['doc_rows']} a step. Learning rate 1e-3, then 5e-4, each stage with warm-up and cosine decay; the "
          "third stage "
          f"{tr['train_seconds'] / 60:.0f} minutes. Top-1 on the copied half of 24 held-out copy units of about 400 "
          f"tokens (`[bos] X \\n\\n X`): {tr['copy_top1_before']:.3f} before this phase, "
          f"**{tr['eval_copy_top1']:.3f}** after it.\n")
    if "mtp_stage" in tr:
        ms = tr["mtp_stage"]
        p(f"A last stage trained the MTP module alone, the main model frozen (`--mtp-only`): {ms['steps']} steps of "
          f"{ms['batch_tokens']} tokens of text rows, learning rate {ms['lr']:g}, {ms['train_seconds'] / 60:.0f} "
          f"minutes; the module's top-1 on the token after next went from {ms['eval_mtp_top1_before']:.3f} to "
          f"{ms['eval_mtp_top1']:.3f} (trainer, held-out text).\n")
    p("Curve: `curve.svg`" + (" (the second phase's copy stages)." if "first_phase" in tr else ".") + "\n")
    p("![training curve](curve.svg)\n")
    p("## Measured\n")
    p(f"Held-out text `eval.txt`: {ref['documents']} documents, {ref['tokens']} scored tokens "
      "(`afd eval`, each document with its BOS, every token after the first scored).\n")
    p("| what | perplexity | next-token top-1 |")
    p("|---|---:|---:|")
    p(f"| afd eval, reference precision (f32) | {ref['perplexity']:.3f} | {ref['top1_accuracy']:.3f} |")
    p(f"| afd eval, fast precision (bf16 activations) | {fast['perplexity']:.3f} | {fast['top1_accuracy']:.3f} |")
    p(f"| afd eval, FP8 twin (`afd quantize --fp8`), fast | {fp8['perplexity']:.3f} "
      f"({(fp8['perplexity'] / fast['perplexity'] - 1) * 100:+.2f} % vs bf16) | {fp8['top1_accuracy']:.3f} |")
    p(f"| trainer (PyTorch f32, same documents) | {tr['eval_ppl']:.3f} | {tr['eval_top1']:.3f} |")
    p(f"| unigram model of the same tokenizer fitted on the training text (add-one) | {uni:.2f} | |")
    p(f"\nPerplexity / unigram perplexity: **{ref['perplexity'] / uni:.3f}** (target at most 0.40).")
    if "mtp_top1_accuracy" in ref:
        p(f"The MTP module's greedy top-1 on the token after next (`afd eval --mtp`, reference precision, "
          f"{ref['mtp_tokens']} predictions): **{ref['mtp_top1_accuracy']:.3f}** (fast precision "
          f"{fast['mtp_top1_accuracy']:.3f}; the trainer measured {tr['eval_mtp_top1']:.3f}; target at least 0.35).")
    c = r["chat"]
    p(f"\nChat check (`scripts/train/chat_check.py` against `afd serve`, greedy, 32 tokens, 20 held-out words): "
      f"**{c['english']} of {c['words']} answer words ({c['english_share'] * 100:.1f} %) are English words** "
      "(Debian's `wamerican` list). The answers:\n")
    p("| question | answer |")
    p("|---|---|")
    for row in c["chat"]:
        p(f"| {row['question']} | {row['answer'].replace('|', '/').replace(chr(10), ' ')} |")
    p("\nContinuations (`/v1/completions`, greedy, 24 tokens):\n")
    for row in c["continuations"]:
        p(f"- *{row['prompt']}*{row['completion'].replace(chr(10), ' ')}")
    p(f"\nMeasured on {datetime.date.today().isoformat()} by `scripts/train/package.sh`.\n")
    p("## Retraining\n")
    p("`scripts/train-model.sh [OUT_DIR] [STEPS]` retrains both shipped models from fixed seeds and rewrites "
      "their directories and cards (on 2 vCPUs: about 90 minutes for both models' first phases, side by side, then "
      "about 80 minutes for the default model's second phase). Commit the result only for a real change.")


if __name__ == "__main__":
    main()
