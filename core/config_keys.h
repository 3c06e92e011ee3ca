/* The one table of configuration keys: section, key, default, range and a
 * one-line description. Included with different definitions of the LOCO_KEY_*
 * macros (core.h builds the struct, config.c the parser and the help).
 * docs/CONFIG.md is generated from this table (`loco config --markdown`). */

LOCO_SECTION_BEGIN(model)
LOCO_KEY_INT(model, n_layer, 4, 1, 1024, "transformer blocks")
LOCO_KEY_INT(model, n_head, 4, 1, 1024, "attention heads per block (must divide n_embd)")
LOCO_KEY_INT(model, n_embd, 128, 8, 65536, "width of the residual stream")
LOCO_KEY_INT(model, seq_len, 128, 2, 65536, "context length T (also the size of the position table)")
LOCO_KEY_INT(model, vocab_size, 256, 2, 1048576, "vocabulary size (256 = bytes, 50257 = GPT-2 BPE)")
LOCO_SECTION_END(model)

LOCO_SECTION_BEGIN(train)
LOCO_KEY_INT(train, batch_size, 16, 1, 65536, "sequences per micro-batch B")
LOCO_KEY_INT(train, grad_accum, 1, 1, 65536, "micro-batches accumulated per optimizer step")
LOCO_KEY_INT(train, steps, 300, 0, 1000000000, "optimizer steps to train")
LOCO_KEY_NUM(train, lr, 3e-3, 0, 10, "peak learning rate of AdamW")
LOCO_KEY_NUM(train, min_lr_frac, 0.1, 0, 1, "final learning rate of the cosine decay, as a fraction of lr")
LOCO_KEY_INT(train, warmup_steps, 30, 0, 1000000000, "steps of linear warm-up from 0 to lr")
LOCO_KEY_NUM(train, weight_decay, 0.1, 0, 10, "AdamW decoupled weight decay (2-D weights only)")
LOCO_KEY_NUM(train, beta1, 0.9, 0, 0.999999, "AdamW first-moment decay")
LOCO_KEY_NUM(train, beta2, 0.95, 0, 0.999999, "AdamW second-moment decay")
LOCO_KEY_NUM(train, eps, 1e-8, 0, 1, "AdamW epsilon")
LOCO_KEY_NUM(train, grad_clip, 1.0, 0, 1e9, "clip the global gradient norm to this (0 = off)")
LOCO_KEY_INT(train, seed, 1337, 0, 9223372036854775807LL, "seed of weight initialisation and sampling")
LOCO_SECTION_END(train)

LOCO_SECTION_BEGIN(data)
LOCO_KEY_STR(data, train, "data/kjv_train_*.bin", "training shards (glob or comma-separated list, llm.c .bin format)")
LOCO_KEY_STR(data, val, "data/kjv_val_*.bin", "validation shards (glob or comma-separated list)")
LOCO_SECTION_END(data)

LOCO_SECTION_BEGIN(run)
LOCO_KEY_STR(run, dir, "runs/tiny", "run directory: metrics.jsonl and checkpoints")
LOCO_KEY_INT(run, log_every, 10, 1, 1000000000, "print a progress line every N steps")
LOCO_KEY_INT(run, eval_every, 100, 0, 1000000000, "evaluate on data.val every N steps (0 = only at the end)")
LOCO_KEY_INT(run, eval_batches, 20, 1, 1000000000, "validation batches per evaluation")
LOCO_KEY_INT(run, ckpt_every, 0, 0, 1000000000, "checkpoint every N steps (0 = only at the end)")
LOCO_KEY_INT(run, threads, 0, 0, 4096, "CPU threads for kernels and BLAS (0 = all cores)")
LOCO_KEY_ENUM(run, log_level, "info", "error|warn|info|debug", "logging level")
LOCO_SECTION_END(run)
