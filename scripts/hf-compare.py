#!/usr/bin/env python3
"""Independent check of the mini-decoder against Hugging Face transformers on the same GGUF.

Loads SmolLM2-135M-Instruct.Q4_1.gguf (default) or Gemma 3 270M's Q4_K_M file (--model
gemma3-270m, or any gemma3 --gguf) through transformers (its GGUF loader dequantises every
tensor to float, the same values the mini-decoder computes at load), then compares:
  1. tokenizer ids on a fixed set of test strings (plain text and ChatML prompts): the
     mini-decoder's `--dump-tokens` against HF `tokenizers` running SmolLM2's tokenizer.json
     pipeline over the GGUF's vocabulary and merges (must be identical), and, for information,
     against transformers' own GGUF tokenizer conversion;
  2. the prompt logits of a fixed chat prompt: the mini-decoder's dense f32 path
     (`--dump-logits`, raw f32 [tokens][vocab]) against the HF model's, fed the same ids:
     top-1 agreement on every position and the max / mean absolute logit difference.
For Gemma 3 the tokenizer reference is transformers' GGUF conversion (AutoTokenizer, which adds
BOS to plain text as the mini-decoder does), the chat strings use Gemma's template, and the
logits are compared on two plain prompts (BOS first): the short one and a long one (the demo
document and the short prompt, ~690 tokens) whose positions past 512 exercise the sliding
window of the local layers.
Prints a short table, writes JSON (--json), exits 0 when the ids are identical to the
reference and the top-1 token agrees on every position, 1 otherwise, 2 on a usage error.

Runs on the CPU or a GPU (--device). Needs torch, transformers (with GGUF support) and the
`gguf` package; on a machine without network access install gguf from a wheel downloaded
elsewhere (docs/mini_decoder.md gives the exact pip commands).

usage: scripts/hf-compare.py [--model smollm2-135m|gemma3-270m] [--gguf PATH]
                             [--mini-decoder BIN] [--device cpu|cuda] [--json OUT]
                             [--prompt TEXT] [--workdir DIR] [--tokenizer-only]
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"

# Plain strings (no special-token text: the mini-decoder parses specials only in chat mode).
TEST_STRINGS = [
    "Hello, world!",
    "The quick brown fox jumps over the lazy dog.",
    "What is the capital of France?",
    "  leading spaces and trailing  ",
    "tabs\tand\nnewlines\n\n\nand    runs of spaces",
    "Numbers: 0 1 12 123 1234 3.14159 -42 1e-5 2024-11-29",
    "I'm sure they'll say it's what we'd've done; you're right, isn't it?",
    "def add(a, b):\n    return a + b  # sum\n",
    "for (int i = 0; i < n; ++i) { x[i] = y[i] * 2; }",
    "KVC_BATCH_LIMIT=37\n# KVC_BATCH_LIMIT=73",
    "naïve café résumé Ångström",
    "日本語のテキストと中文字符",
    "Emoji: 🙂🚀👍🏽 and symbols ©®™ ± ∑ √",
    "Arabic digits ١٢٣ and Devanagari ४५६",
    "UPPER lower MiXeD CamelCaseWord snake_case_word",
    "https://example.com/path?query=1&x=y#frag",
    "email: someone@example.org, phone +1 (555) 010-9999",
    "The pass key is 58231. Remember it. 58231 is the pass key.",
    "",
    "a",
    "two  spaces, three   spaces,\ttab, \n newline after a space",
    "<b>bold</b> and <table><tr><td>cells</td></tr></table>",
]

# Chat prompts (the ChatML template with the default system message; specials are parsed).
CHAT_STRINGS = [
    "What is the capital of France?",
    "Write a haiku about the sea.",
]

# The prompt whose logits are compared (chat mode): a few hundred tokens.
DEFAULT_PROMPT = (
    "Here is a short note. The lighthouse keeper's cat is named Biscuit, and the harvest "
    "festival of Eldmoor is always held in Copperfield Barn. The chief engineer of the river "
    "ferry is Marguerite Okafor. In the configuration file, the archived value of "
    "KVC_BATCH_LIMIT was 73 and the active value is 37. The old miller walked slowly along the "
    "narrow bridge over the stream before breakfast, while the village baker painted a picture "
    "of the yellow fields behind the mill. Question: what is the name of the lighthouse "
    "keeper's cat, and who is the chief engineer of the river ferry?")


def chatml(user):
    return ("<|im_start|>system\n" + DEFAULT_SYSTEM + "<|im_end|>\n<|im_start|>user\n" + user +
            "<|im_end|>\n<|im_start|>assistant\n")


def gemma_chat(user):
    """Gemma's chat template (the 270M GGUF carries none; this is the Gemma 3 one)."""
    return "<bos><start_of_turn>user\n" + user.strip() + "<end_of_turn>\n<start_of_turn>model\n"


def gguf_architecture(path):
    import gguf as gguf_pkg
    f = gguf_pkg.GGUFReader(path).fields["general.architecture"]
    return bytes(f.parts[f.data[0]]).decode()


def find_binary(arg):
    if arg:
        return arg
    for d in ["build", "build-mini", "build-cpu"] + sorted(
            x for x in os.listdir(ROOT) if x.startswith("build")):
        p = os.path.join(ROOT, d, "examples", "mini_decoder", "mini_decoder")
        if os.access(p, os.X_OK):
            return p
    sys.exit("hf-compare: no mini_decoder binary found; build it (cmake --build build --target "
             "mini_decoder) or pass --mini-decoder")


def find_gguf(arg, model):
    if arg:
        return arg
    out = subprocess.run([os.path.join(ROOT, "scripts", "fetch-model"), "--model", model,
                          "--quiet"], check=True, capture_output=True, text=True)
    return out.stdout.strip().splitlines()[-1]


def tokenizers_from_gguf(path):
    """The HF `tokenizers` BPE built straight from the GGUF's vocabulary and merges with the
    smollm pre-tokenizer (digits split, then GPT-2 byte-level): the reference when transformers'
    GGUF loader is unavailable (it needs torch)."""
    import gguf as gguf_pkg
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers
    r = gguf_pkg.GGUFReader(path)

    def field(name):
        f = r.fields[name]
        return [bytes(f.parts[i]).decode("utf-8") if f.types[-1] == gguf_pkg.GGUFValueType.STRING
                else int(f.parts[i][0]) for i in f.data]

    tokens = field("tokenizer.ggml.tokens")
    merges = [tuple(m.split(" ", 1)) for m in field("tokenizer.ggml.merges")]
    types = field("tokenizer.ggml.token_type")
    tok = Tokenizer(models.BPE({t: i for i, t in enumerate(tokens)}, merges, fuse_unk=False))
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])
    tok.decoder = decoders.ByteLevel()
    # Control (3) and user-defined (4) tokens are matched as whole special tokens.
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False)
                            for t, ty in zip(tokens, types) if ty in (3, 4)])
    return lambda text: tok.encode(text, add_special_tokens=False).ids


def mini_tokens(binary, gguf, text, chat, workdir):
    prompt = os.path.join(workdir, "prompt.txt")
    out = os.path.join(workdir, "tokens.txt")
    with open(prompt, "wb") as f:
        f.write(text.encode("utf-8"))
    cmd = [binary, "--model", gguf, "--prompt-file", prompt, "--dump-tokens", out]
    if chat:
        cmd.append("--chat")
    subprocess.run(cmd, check=True, capture_output=True)
    with open(out) as f:
        return [int(x) for x in f.read().split()]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="smollm2-135m", choices=["smollm2-135m", "gemma3-270m"],
                    help="model scripts/fetch-model fetches when --gguf is not given")
    ap.add_argument("--gguf", help="model file (default: scripts/fetch-model --model MODEL)")
    ap.add_argument("--mini-decoder", help="mini_decoder binary (default: build*/examples/...)")
    ap.add_argument("--device", default="cpu", help="torch device: cpu (default) or cuda")
    ap.add_argument("--mini-device", default="auto",
                    help="where the mini_decoder's model runs: auto (default), cpu or cuda")
    ap.add_argument("--json", default="hf-compare.json", help="JSON report (default %(default)s)")
    ap.add_argument("--prompt", default=DEFAULT_PROMPT, help="user message of the logits prompt")
    ap.add_argument("--workdir", help="folder for the dumps (default: a temporary one)")
    ap.add_argument("--tokenizer-only", action="store_true",
                    help="compare the tokenizer ids only (no torch needed)")
    ap.add_argument("--skip-tokenizer", action="store_true",
                    help="compare the logits only")
    args = ap.parse_args()

    import numpy as np
    import transformers
    from transformers import AutoTokenizer
    if not args.tokenizer_only:
        import torch
        from transformers import AutoModelForCausalLM

    binary = find_binary(args.mini_decoder)
    gguf = find_gguf(args.gguf, args.model)
    arch = gguf_architecture(gguf)
    gemma = arch == "gemma3"
    gdir, gname = os.path.dirname(os.path.abspath(gguf)), os.path.basename(gguf)
    work = args.workdir or tempfile.mkdtemp(prefix="hf-compare.")
    os.makedirs(work, exist_ok=True)
    torch_version = "-" if args.tokenizer_only else torch.__version__
    report = {
        "gguf": gguf, "architecture": arch, "mini_decoder": binary, "device": args.device,
        "mini_device": args.mini_device,
        "torch": torch_version, "transformers": transformers.__version__,
    }
    print(f"hf-compare: {gguf}\n  mini_decoder {binary}\n  torch {torch_version}, "
          f"transformers {transformers.__version__}, device {args.device}, "
          f"mini_decoder device {args.mini_device}")

    # --- 1. tokenizer ------------------------------------------------------------------------
    t0 = time.time()
    # Two references: transformers' own GGUF tokenizer conversion (needs torch), and the HF
    # `tokenizers` pipeline of SmolLM2's tokenizer.json (Digits(individual_digits) + ByteLevel)
    # built from the GGUF's vocabulary and merges. They differ on non-ASCII digits (the GGUF
    # conversion does not split them one by one); the second is the one that must match.
    references, names = {}, {}
    must_match = "tokenizers"
    if not gemma:
        references["tokenizers"] = tokenizers_from_gguf(gguf)
        import tokenizers
        names["tokenizers"] = (f"tokenizers {tokenizers.__version__}: BPE from the GGUF "
                               "vocabulary and merges, Digits(individual_digits) + ByteLevel "
                               "(SmolLM2's tokenizer.json pipeline)")
    try:
        auto = AutoTokenizer.from_pretrained(gdir, gguf_file=gname)
        # Gemma: plain text gets BOS (add_bos_token), as the mini-decoder's plain prompts; the
        # chat template writes its own "<bos>".
        references["transformers"] = lambda text, chat=False: auto(
            text, add_special_tokens=gemma and not chat)["input_ids"]
        names["transformers"] = (f"transformers {transformers.__version__} AutoTokenizer "
                                 "(its GGUF conversion)")
    except Exception as e:  # transformers' GGUF loader needs torch
        if gemma:
            raise
        print(f"  transformers' GGUF tokenizer unavailable ({type(e).__name__}); skipped")
    if gemma:
        must_match = "transformers"
    for k, v in names.items():
        print(f"  tokenizer reference {k}: {v}")
    report["tokenizer_references"] = names
    rows = []
    cases = [(s, False) for s in TEST_STRINGS] + [(s, True) for s in CHAT_STRINGS]
    if args.skip_tokenizer:
        cases = []
    for text, chat in cases:
        mine = mini_tokens(binary, gguf, text, chat, work)
        full = (gemma_chat(text) if gemma else chatml(text)) if chat else text
        row = {"text": full, "chat": chat, "mini_decoder": mine}
        for k, enc in references.items():
            row[k] = enc(full, chat) if k == "transformers" else enc(full)
            row["identical_" + k] = mine == row[k]
        row["identical"] = row["identical_" + must_match]
        rows.append(row)
    same = sum(r["identical"] for r in rows)
    report["tokenizer"] = {"strings": len(rows), "identical": same,
                           "identical_by_reference": {k: sum(r["identical_" + k] for r in rows)
                                                      for k in references},
                           "cases": rows, "seconds": round(time.time() - t0, 2)}

    def tokenizer_lines():
        for k in references:
            n = report["tokenizer"]["identical_by_reference"][k]
            print(f"| tokenizer ids identical to {k} | {n} / {len(rows)} strings |")

    def tokenizer_diffs():
        for r in rows:
            for k in references:
                if not r["identical_" + k]:
                    print(f"tokenizer differs from {k} on {r['text']!r}:\n"
                          f"  mini {r['mini_decoder']}\n  {k} {r[k]}")

    if args.tokenizer_only:
        report["ok"] = same == len(rows)
        print()
        tokenizer_lines()
        tokenizer_diffs()
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)
        print(f"\n{'OK' if report['ok'] else 'MISMATCH'}; wrote {args.json}")
        return 0 if report["ok"] else 1

    # --- 2. prompt logits --------------------------------------------------------------------
    # SmolLM2: one chat prompt. Gemma 3 (a base model): two plain prompts, BOS first; the long
    # one has positions past the 512-token window of the local layers.
    if gemma:
        with open(os.path.join(ROOT, "examples", "mini_decoder", "demo_prompt.txt")) as f:
            long_prompt = f.read().strip() + "\n\n" + args.prompt
        prompts = [("short", args.prompt, False), ("long", long_prompt, False)]
    else:
        prompts = [("chat", args.prompt, True)]

    t0 = time.time()
    model = AutoModelForCausalLM.from_pretrained(gdir, gguf_file=gname, dtype=torch.float32)
    tied_fixed = False
    emb = model.get_input_embeddings().weight
    head = model.get_output_embeddings().weight
    if emb.data_ptr() != head.data_ptr() and not torch.equal(emb, head):
        # The GGUF has no output.weight (the LM head is the embedding); tie them when the loader
        # left the head untied.
        import gguf as gguf_pkg
        tensor_names = {t.name for t in gguf_pkg.GGUFReader(gguf).tensors}
        if "output.weight" not in tensor_names:
            model.get_output_embeddings().weight = model.get_input_embeddings().weight
            tied_fixed = True
    model = model.to(args.device).eval()
    load_s = time.time() - t0

    def compare(name, text, chat):
        t0 = time.time()
        logits_file = os.path.join(work, "logits.f32")
        prompt_file = os.path.join(work, "logits_prompt.txt")
        with open(prompt_file, "wb") as f:
            f.write(text.encode("utf-8"))
        ids = mini_tokens(binary, gguf, text, chat, work)
        cmd = [binary, "--model", gguf, "--prompt-file", prompt_file, "--device",
               args.mini_device, "--max-tokens", "0", "--dump-logits", logits_file]
        if chat:
            cmd.append("--chat")
        subprocess.run(cmd, check=True, capture_output=True)
        mine = np.fromfile(logits_file, dtype=np.float32)
        os.remove(logits_file)
        vocab = mine.size // len(ids)
        mine = mine.reshape(len(ids), vocab)
        mini_s = time.time() - t0
        t0 = time.time()
        with torch.no_grad():
            theirs = model(torch.tensor([ids], device=args.device)).logits[0].float().cpu().numpy()
        hf_s = time.time() - t0
        if theirs.shape[1] != vocab:
            sys.exit(f"hf-compare: vocab {theirs.shape[1]} (hf) != {vocab} (mini_decoder)")
        diff = np.abs(mine - theirs)
        top_mine, top_theirs = mine.argmax(1), theirs.argmax(1)
        agree = top_mine == top_theirs
        srt = np.partition(theirs, -2, axis=1)[:, -2:]
        margin = srt[:, 1] - srt[:, 0]  # hf's top-1 margin: small margins explain disagreement
        disagreements = [{"position": int(p), "mini_decoder": int(top_mine[p]),
                          "hf": int(top_theirs[p]), "hf_top2_margin": float(margin[p])}
                         for p in np.nonzero(~agree)[0]]
        row = {
            "name": name, "chat": chat, "prompt_tokens": len(ids), "vocab": vocab,
            "top1_agree": int(agree.sum()), "top1_agree_fraction": float(agree.mean()),
            "max_abs_diff": float(diff.max()), "mean_abs_diff": float(diff.mean()),
            "max_abs_diff_last_position": float(diff[-1].max()),
            "logit_range": [float(theirs.min()), float(theirs.max())],
            "disagreements": disagreements,
            "mini_decoder_seconds": round(mini_s, 2), "hf_seconds": round(hf_s, 2),
        }
        if gemma and len(ids) > 512:
            late = diff[512:]
            row["positions_past_512"] = len(ids) - 512
            row["max_abs_diff_past_512"] = float(late.max())
            row["top1_agree_past_512"] = int(agree[512:].sum())
        return row

    rows_logits = [compare(*p) for p in prompts]
    report["logits"] = rows_logits[0] if len(rows_logits) == 1 else rows_logits
    report["lm_head_tied_by_script"] = tied_fixed
    report["hf_load_seconds"] = round(load_s, 2)
    ok = same == len(rows) and all(r["top1_agree"] == r["prompt_tokens"] for r in rows_logits)
    report["ok"] = ok

    # --- table -------------------------------------------------------------------------------
    print()
    print("| check | result |")
    print("|---|---|")
    tokenizer_lines()
    for lg in rows_logits:
        label = "" if len(rows_logits) == 1 else f" ({lg['name']}, {lg['prompt_tokens']} tokens)"
        print(f"| prompt logits{label}: top-1 agreement | {lg['top1_agree']} / "
              f"{lg['prompt_tokens']} positions |")
        print(f"| max abs logit difference{label} | {lg['max_abs_diff']:.4g} (logits in "
              f"[{lg['logit_range'][0]:.1f}, {lg['logit_range'][1]:.1f}]) |")
        print(f"| mean abs logit difference{label} | {lg['mean_abs_diff']:.4g} |")
        if "positions_past_512" in lg:
            print(f"| past position 512{label} | top-1 {lg['top1_agree_past_512']} / "
                  f"{lg['positions_past_512']}, max abs difference "
                  f"{lg['max_abs_diff_past_512']:.4g} |")
    if tied_fixed:
        print("| note | transformers left lm_head untied; the script tied it to the embedding |")
    tokenizer_diffs()
    for lg in rows_logits:
        for d in lg["disagreements"][:10]:
            print(f"top-1 differs ({lg['name']}) at position {d['position']}: mini "
                  f"{d['mini_decoder']}, hf {d['hf']} (hf top-2 margin {d['hf_top2_margin']:.3g})")
    with open(args.json, "w") as f:
        json.dump(report, f, indent=1)
    print(f"\n{'OK' if ok else 'MISMATCH'}; wrote {args.json}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
