#!/usr/bin/env python3
"""Turns kernels/cuda/*.cu into one host C++ file for emu.h: kernels become
functions, launches `k<<<grid, block, smem, s>>>(args)` become
emu_launch(grid, block, smem, [&] { k(args); }), __shared__ variables
statics, dynamic shared memory emu.h's buffer, cuBLASLt the stand-in of
fake_cublaslt.h, the runtime (cudaMalloc, copies) emu.h's host versions.
Usage: translate.py REPO OUT.cpp"""
import sys

FILES = ["device", "elementwise", "layernorm", "xent", "tp", "attention", "attention_tc",
         "attention_block", "quant", "moe", "matmul"]
FILES += ["rmsnorm", "rope", "swiglu"]  # the Llama-family twins
FILES += ["topk"]  # the top-k codec




def split_top(t):
    parts, depth, cur = [], 0, ""
    for ch in t:
        depth += ch in "([" and 1 or 0
        depth -= ch in ")]" and 1 or 0
        if ch == "," and depth == 0:
            parts.append(cur.strip())
            cur = ""
        else:
            cur += ch
    parts.append(cur.strip())
    return parts


def launches(s):
    out, pos = "", 0
    while True:
        i = s.find("<<<", pos)
        if i < 0:
            return out + s[pos:]
        k = i
        while s[k - 1].isspace():
            k -= 1
        if s[k - 1] == ">":  # template arguments
            depth, k = 0, k - 1
            while True:
                depth += s[k] == ">"
                depth -= s[k] == "<"
                if depth == 0:
                    break
                k -= 1
        while k > 0 and (s[k - 1].isalnum() or s[k - 1] == "_"):
            k -= 1
        name = " ".join(s[k:i].split())
        j = s.index(">>>", i)
        cfg = split_top(s[i + 3:j])
        a = s.index("(", j)
        depth, b = 0, a
        while True:
            depth += s[b] == "("
            depth -= s[b] == ")"
            if depth == 0:
                break
            b += 1
        smem = cfg[2] if len(cfg) > 2 else "0"
        out += s[pos:k] + f"emu_launch(dim3({cfg[0]}), dim3({cfg[1]}), {smem}, [&] {{ {name}({s[a + 1:b]}); }})"
        pos = b + 1


def main():
    repo, dst = sys.argv[1], sys.argv[2]
    common = open(f"{repo}/kernels/cuda/common.cuh").read()
    i = common.index("template <typename T> __device__ __forceinline__ T warp_sum")
    j = common.rindex("#endif")
    out = ['#define LOCO_CUBLASLT_LINKED 1\n#include "tests/gpu/emu/emu.h"\n#include "tests/gpu/emu/fake_cublaslt.h"\n',
           common[i:j].replace("__device__ __forceinline__", "static inline").replace("__device__", "static inline")]
    for f in FILES:
        s = open(f"{repo}/kernels/cuda/{f}.cu").read()
        for a, b in [('#include "kernels/cuda/common.cuh"', ""), ("#include <cublasLt.h>", ""),
                     ('extern "C" {\n#include "compress/compress.h"\n}', ""),
                     ("extern __shared__ float sm[];", "float *sm = g_smem;"),
                     ("__host__ __device__", "__device__"),
                     ("__device__ __forceinline__", "static inline"), ("__device__ void", "inline void"),
                     ("__shared__", "static")]:
            s = s.replace(a, b)
        while "__launch_bounds__(" in s:
            i = s.index("__launch_bounds__(")
            s = s[:i] + s[s.index(")", i) + 1:]
        s = s.replace("__global__ void", "static void")
        # one namespace per file keeps their static helpers apart; matmul.cu
        # and device.cu define global structs (loco_blas, loco_cuda_slab)
        glob = f in ("matmul", "device")
        out.append(launches(s) if glob else f"namespace emu_{f} {{\n{launches(s)}\n}}\n")
    open(dst, "w").write("".join(out))


if __name__ == "__main__":
    main()
