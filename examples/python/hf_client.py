#!/usr/bin/env python3
"""A Hugging Face transformers model decoding with its KV cache and attention in kvc.

SmolLM2-135M-Instruct is loaded from the GGUF that scripts/fetch-model puts in ~/.cache/kvc
(transformers reads GGUF with the `gguf` package). A transformers Cache subclass (KvcCache)
writes every layer's post-RoPE K/V into one kvc.LayeredCache, and an attention function
registered as "kvc" attends every decode step through kvc (BlockIndex -> Selector ->
AttentionBackend over cache.layer(l)); the prompt is attended densely once (as the C++ demo does:
kvc's multi-token attention covers at most the ring's W query tokens) and is in kvc from then on.

It runs three decodes of the same prompt and prints one JSON line with the comparison:
  1. transformers' own: its dense DynamicCache and SDPA attention (the reference);
  2. kvc in dense mode (old blocks in f16: exact attention over every token): greedy tokens must
     be identical to (1) (`dense_identical`), logits within `dense_max_abs_logit_diff`;
  3. kvc in block_select_exact mode (ring + open block + top-k selected blocks), teacher-forced
     on (1)'s tokens: `block_select_top1_agreement` is the share of steps whose greedy token equals
     (1)'s.
Exit status 1 when (2) is not identical.

  python examples/python/hf_client.py [--device cuda] [--steps 48] [--ring 128] [--topk 4]
  python examples/python/hf_client.py --random-model   # no GGUF: a small random Llama (GQA 9/3,
                                                       # head_dim 64) and a random prompt
"""

import argparse
import json
import os
import pathlib
import sys
import time

import torch
from transformers import AttentionInterface, AutoModelForCausalLM, AutoTokenizer, DynamicCache
from transformers.integrations.sdpa_attention import sdpa_attention_forward

import kvc

DOCUMENT = (
    "The lighthouse keeper kept a logbook of every ship that passed the point. In the spring "
    "he noted a schooner with red sails, three fishing boats and a ferry that ran late twice. "
    "His cat, a grey tabby named Biscuit, slept on the logbook whenever the stove was lit. "
) * 12
QUESTION = "What is the name of the lighthouse keeper's cat, and what did he keep a log of?"


class KvcSession:
    """kvc's side of one generation: the LayeredCache, the scorer, selector and attention."""

    def __init__(self, model, mode, ring, block, topk, max_context, device):
        cfg = model.config
        self.layers = cfg.num_hidden_layers
        self.hq = cfg.num_attention_heads
        self.hkv = cfg.num_key_value_heads
        self.d = cfg.hidden_size // cfg.num_attention_heads
        self.mode = mode
        self.topk = topk
        self.device = device
        layer = kvc.KvStoreConfig(num_kv_heads=self.hkv, head_dim=self.d, max_slots=1,
                                  max_context=max_context, recent_window=ring, block_size=block,
                                  dtype="f16", old_format="f16" if mode == "dense" else "fp16k_q4v")
        self.cache = kvc.LayeredCache(kvc.LayeredCacheConfig(layer=layer, num_layers=self.layers),
                                      device)
        self.slot = self.cache.open_slot()
        self.index = kvc.BlockIndex(kvc.BlockIndexConfig(num_q_heads=self.hq,
                                                         num_kv_heads=self.hkv, head_dim=self.d),
                                    device)
        self.selector = kvc.Selector(device)
        self.attention = kvc.AttentionBackend(
            kvc.AttentionConfig(num_q_heads=self.hq, num_kv_heads=self.hkv, head_dim=self.d,
                                mode=mode), device)
        self.policy = kvc.SelectPolicy.topk(topk)

    def store(self, layer, key, value):
        """key, value [1, Hkv, T, d] (post-RoPE): the step's K/V of one layer into kvc."""
        T = key.shape[2]
        if layer == 0:
            self.cache.begin_update([self.slot], T)  # bookkeeping once per step, every layer
        k = key[0].transpose(0, 1).to(torch.float16).contiguous()[None]  # [1, T, Hkv, d]
        v = value[0].transpose(0, 1).to(torch.float16).contiguous()[None]
        self.cache.write(layer, k, v)

    def attend(self, layer, query, scaling):
        """query [1, Hq, 1, d] -> attention output [1, 1, Hq, d] through kvc."""
        q = query.transpose(1, 2).to(torch.float16).contiguous()  # [1, 1, Hq, d]
        store = self.cache.layer(layer)
        ids = counts = None
        if kvc.uses_selection(self.attention.config.mode):
            scores, valid = self.index.score(store, [self.slot], q)
            ids, counts = self.selector.select(scores, valid, self.policy)
        out = self.attention.decode(store, [self.slot], q, ids, counts, out_dtype="f32")
        return out.to(query.dtype)


class KvcCache(DynamicCache):
    """transformers' cache with every layer's K/V written into kvc as well (the dense copy keeps
    transformers' own bookkeeping — lengths, masks — working; kvc attention never reads it)."""

    def __init__(self, session):
        super().__init__()
        self.session = session

    def update(self, key_states, value_states, layer_idx, *args, **kwargs):
        self.session.store(layer_idx, key_states, value_states)
        return super().update(key_states, value_states, layer_idx, *args, **kwargs)


def kvc_attention(module, query, key, value, attention_mask, scaling=None, **kwargs):
    session = module.kvc_session
    if query.shape[2] > 1 or session is None:  # the prompt: dense, once
        return sdpa_attention_forward(module, query, key, value, attention_mask,
                                      scaling=scaling, **kwargs)
    return session.attend(module.layer_idx, query, scaling), None


AttentionInterface.register("kvc", kvc_attention)


def set_session(model, session):
    for m in model.modules():
        if hasattr(m, "layer_idx") and hasattr(m, "q_proj"):
            m.kvc_session = session


@torch.no_grad()
def decode(model, prompt, steps, cache, forced=None):
    """Greedy decode (or teacher-forced on `forced`): the tokens chosen and each step's logits."""
    out = model(input_ids=prompt, past_key_values=cache, use_cache=True)
    logits = [out.logits[0, -1].float()]
    tokens = []
    for step in range(steps):
        choice = int(logits[-1].argmax())
        tokens.append(choice)
        feed = choice if forced is None else forced[step]
        nxt = torch.tensor([[feed]], device=prompt.device)
        out = model(input_ids=nxt, past_key_values=cache, use_cache=True)
        logits.append(out.logits[0, -1].float())
    return tokens, logits[:-1]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model-dir", default=os.environ.get("KVC_MODEL_DIR",
                                                           str(pathlib.Path.home() / ".cache/kvc")))
    ap.add_argument("--gguf", default="SmolLM2-135M-Instruct.Q4_1.gguf")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--steps", type=int, default=48)
    ap.add_argument("--ring", type=int, default=128)
    ap.add_argument("--block", type=int, default=32)
    ap.add_argument("--topk", type=int, default=4)
    ap.add_argument("--random-model", action="store_true",
                    help="a 4-layer random Llama with SmolLM2's head shape instead of the GGUF")
    ap.add_argument("--prompt-tokens", type=int, default=700, help="with --random-model")
    args = ap.parse_args()

    t0 = time.time()
    tok = None
    if args.random_model:
        from transformers import LlamaConfig, LlamaForCausalLM

        torch.manual_seed(0)
        cfg = LlamaConfig(vocab_size=2048, hidden_size=576, intermediate_size=1536,
                          num_hidden_layers=4, num_attention_heads=9, num_key_value_heads=3,
                          max_position_embeddings=8192, rope_theta=100000.0)
        model = LlamaForCausalLM(cfg).to(args.device)
        prompt = torch.randint(0, cfg.vocab_size, (1, args.prompt_tokens),
                               generator=torch.Generator().manual_seed(1)).to(args.device)
    else:
        tok = AutoTokenizer.from_pretrained(args.model_dir, gguf_file=args.gguf)
        model = AutoModelForCausalLM.from_pretrained(args.model_dir, gguf_file=args.gguf,
                                                     torch_dtype=torch.float32).to(args.device)
        messages = [{"role": "user", "content": DOCUMENT + "\n\n" + QUESTION}]
        prompt = tok.apply_chat_template(messages, add_generation_prompt=True,
                                         return_tensors="pt")
        if not isinstance(prompt, torch.Tensor):
            prompt = prompt["input_ids"]
        prompt = prompt.to(args.device)
    model.eval()
    n = prompt.shape[1]
    load_s = time.time() - t0

    model.config._attn_implementation = "sdpa"
    set_session(model, None)
    ref_tokens, ref_logits = decode(model, prompt, args.steps, DynamicCache())

    model.config._attn_implementation = "kvc"
    dense = KvcSession(model, "dense", args.ring, args.block, args.topk, n + args.steps + 1,
                       args.device)
    set_session(model, dense)
    dense_tokens, dense_logits = decode(model, prompt, args.steps, KvcCache(dense))

    sel = KvcSession(model, "block_select_exact", args.ring, args.block, args.topk,
                     n + args.steps + 1, args.device)
    set_session(model, sel)
    sel_tokens, _ = decode(model, prompt, args.steps, KvcCache(sel), forced=ref_tokens)

    diff = max(float((a - b).abs().max()) for a, b in zip(ref_logits, dense_logits))
    agree = sum(int(a == b) for a, b in zip(sel_tokens, ref_tokens)) / len(ref_tokens)
    report = {
        "model": "random-llama-4l" if args.random_model else args.gguf, "device": args.device, "prompt_tokens": n, "steps": args.steps,
        "ring": args.ring, "block": args.block, "topk": args.topk,
        "dense_identical": dense_tokens == ref_tokens,
        "dense_max_abs_logit_diff": diff,
        "block_select_top1_agreement": agree,
        "kvc_tokens_held": sel.cache.length(sel.slot),
        "answer": tok.decode(ref_tokens, skip_special_tokens=True) if tok else None,
        "load_s": round(load_s, 2), "total_s": round(time.time() - t0, 2),
    }
    print(json.dumps(report))
    return 0 if report["dense_identical"] else 1


if __name__ == "__main__":
    sys.exit(main())
