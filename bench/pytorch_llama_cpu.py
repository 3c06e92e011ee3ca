#!/usr/bin/env python3
"""PyTorch eager's training step of configs/tiny-llama.ini's model on the CPU,
the reference beside `loco bench step` (scripts/llama-cpu-bench.sh runs
both in one go).

The model is tests/fixtures/make_llama_fixtures.py's plain-PyTorch Llama
(RMSNorm, RoPE, grouped-query attention, SwiGLU, untied head) at
tiny-llama's shape: 4 layers, 4 heads with 2 key/value heads, width 128,
SwiGLU 384, vocabulary 256, B x T = 16 x 128. A step is what loco's is:
forward, backward, global-norm clipping to 1.0, AdamW (torch.optim.AdamW,
the foreach implementation). fp32, `--threads` intra-op threads (the same
count loco is given). Prints one JSON line:
{"impl": "pytorch-eager", "tok_per_s": ..., "step_ms": ...}.
"""
import argparse
import json
import os
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests",
                                "fixtures"))
from make_llama_fixtures import init_params, llama_loss  # noqa: E402

TINY_LLAMA = dict(n_layer=4, n_head=4, n_kv_head=2, n_embd=128, ffn_hidden=384, vocab_size=256,
                  seq_len=128, rope_theta=10000.0, rope_factor=0.0, rope_low_freq=1.0,
                  rope_high_freq=4.0, rope_original_max_pos=8192, norm_eps=1e-5)


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--steps", type=int, default=10)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    gen = torch.Generator().manual_seed(1)
    params = init_params(TINY_LLAMA, gen)
    for p in params.values():
        p.requires_grad_(True)
    opt = torch.optim.AdamW(list(params.values()), lr=1e-4, betas=(0.9, 0.95), eps=1e-8,
                            weight_decay=0.1)
    B, T = args.batch, args.seq
    tok = torch.randint(0, TINY_LLAMA["vocab_size"], (B * T + 1,), generator=gen)
    x, y = tok[:-1].view(B, T), tok[1:].view(B, T)
    total = 0.0
    for it in range(args.warmup + args.steps):
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss = llama_loss(params, x, y, TINY_LLAMA)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(list(params.values()), 1.0)
        opt.step()
        dt = time.perf_counter() - t0
        if it >= args.warmup:
            total += dt
    step = total / args.steps
    print(json.dumps({"impl": "pytorch-eager", "torch": torch.__version__,
                      "threads": args.threads, "B": B, "T": T,
                      "params": sum(p.numel() for p in params.values()),
                      "step_ms": round(step * 1e3, 2), "tok_per_s": round(B * T / step)}))


if __name__ == "__main__":
    main()
