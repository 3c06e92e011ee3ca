#!/usr/bin/env python3
"""GPT-2 training steps in PyTorch: the reference that scripts/gpu-check.sh
puts beside build/loco-gpu-bench. The same model as loco's (Hugging Face
GPT-2 layout: pre-LN blocks, tanh GELU, LayerNorm eps 1e-5, tied head, vocab
padded to 50304 as loco-gpu-bench's default), bf16 autocast over fp32
weights, fused AdamW (lr 6e-4, betas 0.9/0.95, eps 1e-8, weight decay 0.1 on
2-D tensors), flash attention through scaled_dot_product_attention, and the
same learnable synthetic token stream.

--mode eager or compile (torch.compile). Prints a line per step and a JSON
summary last: {"impl": "pytorch-eager", "tok_per_s": ..., "mfu": ...}, with
MFU from the same FLOP count as loco (6N + 12 L C T per token, as llm.c).

--mode sdpa: the reference of `loco-gpu-bench --bench attention`, causal
scaled_dot_product_attention forward + backward in bf16 at --batch, --seq,
--heads, --embd (q, k, v views of one (B, T, 3C) tensor, as in the model),
timed with CUDA events, the median of 5 repeats of --iters calls:
{"impl": "pytorch-sdpa", "bench": "attention", "ms": ..., "tflops": ...},
FLOPs as FlashAttention's benchmarks count them (forward 4 B NH T^2 hs / 2,
backward 2.5 times that).

--mode versions: PyTorch's, its CUDA's, cuDNN's and NCCL's versions and the
device, as one JSON line (no GPU needed)."""
import argparse
import json
import math
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


class Block(nn.Module):
    def __init__(self, C, NH):
        super().__init__()
        self.nh = NH
        self.ln_1 = nn.LayerNorm(C, eps=1e-5)
        self.c_attn = nn.Linear(C, 3 * C)
        self.c_proj = nn.Linear(C, C)
        self.ln_2 = nn.LayerNorm(C, eps=1e-5)
        self.c_fc = nn.Linear(C, 4 * C)
        self.mlp_proj = nn.Linear(4 * C, C)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.c_attn(self.ln_1(x)).split(C, dim=2)
        q, k, v = (t.view(B, T, self.nh, C // self.nh).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.c_proj(y.transpose(1, 2).contiguous().view(B, T, C))
        return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))


class GPT(nn.Module):
    def __init__(self, L, NH, C, V, maxT):
        super().__init__()
        self.wte = nn.Embedding(V, C)
        self.wpe = nn.Embedding(maxT, C)
        self.h = nn.ModuleList(Block(C, NH) for _ in range(L))
        self.ln_f = nn.LayerNorm(C, eps=1e-5)
        for name, p in self.named_parameters():
            if p.dim() == 2:
                sd = 0.02 / math.sqrt(2 * L) if name.endswith("proj.weight") else 0.02
                nn.init.normal_(p, 0.0, sd)
            elif name.endswith("bias"):
                nn.init.zeros_(p)

    def forward(self, idx, targets):
        T = idx.shape[1]
        x = self.wte(idx) + self.wpe(torch.arange(T, device=idx.device))
        for b in self.h:
            x = b(x)
        logits = F.linear(self.ln_f(x), self.wte.weight)
        return F.cross_entropy(logits.float().view(-1, logits.size(-1)), targets.view(-1))


def batch(step, B, T, V, device):
    p = torch.arange(step * B * T, (step + 1) * B * T + 1, dtype=torch.int64)
    tok = ((p // 7) * 31 + (p % 7) * 3) % 997 % V
    return tok[:-1].view(B, T).to(device), tok[1:].view(B, T).to(device)


def versions():
    cudnn = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
    if cudnn:  # 91300 is 9.13.0; before 9, 8902 was 8.9.2
        cudnn = (f"{cudnn // 10000}.{cudnn // 100 % 100}.{cudnn % 100}" if cudnn >= 90000
                 else f"{cudnn // 1000}.{cudnn // 100 % 10}.{cudnn % 100}")
    try:
        nccl = ".".join(str(v) for v in torch.cuda.nccl.version())
    except (AttributeError, RuntimeError, TypeError):
        nccl = None
    dev = torch.cuda.get_device_name() if torch.cuda.is_available() else None
    print(json.dumps({"bench": "versions", "torch": torch.__version__, "torch_cuda": torch.version.cuda,
                      "cudnn": cudnn, "nccl": nccl, "device": dev}), flush=True)


def sdpa(a):
    B, T, NH, C = a.batch, a.seq, a.heads, a.embd
    hs = C // NH
    g = torch.Generator(device="cuda").manual_seed(1)
    qkv = (2 * torch.rand(B, T, 3 * C, device="cuda", generator=g) - 1).to(torch.bfloat16)
    qkv.requires_grad_()
    dy = (2 * torch.rand(B, NH, T, hs, device="cuda", generator=g) - 1).to(torch.bfloat16)

    def once():
        q, k, v = (t.view(B, T, NH, hs).transpose(1, 2) for t in qkv.split(C, dim=2))
        F.scaled_dot_product_attention(q, k, v, is_causal=True).backward(dy)

    once()
    times = []
    for _ in range(5):
        t0, t1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        t0.record()
        for _ in range(a.iters):
            once()
        t1.record()
        t1.synchronize()
        times.append(t0.elapsed_time(t1) / a.iters / 1e3)
    s = sorted(times)[len(times) // 2]
    fwd = 4.0 * B * NH * T * T * hs / 2
    print(json.dumps({"impl": "pytorch-sdpa", "bench": "attention", "dtype": "bf16", "B": B, "T": T,
                      "NH": NH, "hs": hs, "causal": True, "ms": round(1e3 * s, 3),
                      "tflops": round(3.5 * fwd / s / 1e12, 2)}), flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--mode", choices=["eager", "compile", "sdpa", "versions"], default="eager")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--heads", type=int, default=12)
    ap.add_argument("--embd", type=int, default=768)
    ap.add_argument("--vocab", type=int, default=50304)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--peak-tflops", type=float, default=989.0)
    ap.add_argument("--iters", type=int, default=10, help="sdpa: timed calls per repeat")
    a = ap.parse_args()
    if a.mode == "versions":
        return versions()
    if a.mode == "sdpa":
        return sdpa(a)
    torch.manual_seed(1337)
    torch.backends.cuda.matmul.allow_tf32 = True
    dev = "cuda"
    model = GPT(a.layers, a.heads, a.embd, a.vocab, a.seq).to(dev)
    decay = [p for p in model.parameters() if p.dim() >= 2]
    other = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                             {"params": other, "weight_decay": 0.0}],
                            lr=6e-4, betas=(0.9, 0.95), eps=1e-8, fused=True)
    fwd = torch.compile(model) if a.mode == "compile" else model
    nparams = sum(p.numel() for p in model.parameters())
    C, L, T = a.embd, a.layers, a.seq
    flops_tok = 6.0 * (L * 12.0 * C * C + a.vocab * C) + 12.0 * L * C * T
    tokens = a.batch * a.seq
    t_sum, measured, first, loss_v = 0.0, 0, None, None
    for s in range(a.warmup + a.steps):
        x, y = batch(s, a.batch, a.seq, a.vocab, dev)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        with torch.autocast(device_type="cuda", dtype=torch.bfloat16):
            loss = fwd(x, y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        loss_v = loss.item()
        torch.cuda.synchronize()
        dt = time.perf_counter() - t0
        first = loss_v if first is None else first
        if s >= a.warmup:
            t_sum += dt
            measured += 1
        print(f"step {s + 1:3d}  loss {loss_v:.4f}  {dt * 1e3:.1f} ms  {tokens / dt:.0f} tok/s"
              + ("  (warm-up)" if s < a.warmup else ""), flush=True)
    tps = tokens * measured / t_sum if measured else 0.0
    print(json.dumps({"impl": f"pytorch-{a.mode}", "mode": "bf16-autocast", "B": a.batch,
                      "T": a.seq, "params": nparams,
                      "step_ms": round(1e3 * t_sum / max(measured, 1), 2),
                      "tok_per_s": round(tps), "mfu": round(tps * flops_tok / (a.peak_tflops * 1e12), 4),
                      "loss_first": round(first, 4), "loss_last": round(loss_v, 4)}), flush=True)


if __name__ == "__main__":
    main()
