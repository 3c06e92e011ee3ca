/* `loco bench step`: tokens/s and achieved GFLOP/s of a full training step
 * (forward, backward, clip, AdamW) beside OpenBLAS sgemm measured in the
 * same run, the ceiling of this CPU path: the tiny GPT-2, the tiny Llama
 * (scripts/llama-cpu-bench.sh puts PyTorch's beside it) and GPT-2 124M. */
#include "bench/bench.h"
#include "core/core.h"
#include "inner/model/model.h"
#include "inner/optim/optim.h"

#include <cblas.h>
#include <stdlib.h>
#include <string.h>

static double sgemm_gflops(int n, int reps) {
    float *a = loco_alloc((size_t)n * n * sizeof(float));
    float *b = loco_alloc((size_t)n * n * sizeof(float));
    float *c = loco_alloc((size_t)n * n * sizeof(float));
    if (!a || !b || !c) {
        loco_free(a), loco_free(b), loco_free(c);
        return 0;
    }
    for (size_t i = 0; i < (size_t)n * n; i++)
        a[i] = b[i] = (float)(i % 17) * 0.01f;
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1, a, n, b, n, 0, c, n);
    double best = 1e30;
    for (int r = 0; r < reps; r++) {
        double t0 = loco_now();
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1, a, n, b, n, 0, c, n);
        double dt = loco_now() - t0;
        if (dt < best)
            best = dt;
    }
    loco_free(a), loco_free(b), loco_free(c);
    return 2.0 * n * (double)n * n / best / 1e9;
}

typedef struct {
    const char *name;
    loco_gpt_config cfg;
    int B, T, warmup, steps;
} shape;

static int bench_shape(const shape *s, double *tok_s, double *gflops, double *step_s) {
    loco_config cfg;
    loco_config_defaults(&cfg);
    loco_gpt *m = NULL;
    loco_adamw opt;
    LOCO_CHECK(loco_gpt_create(&m, &s->cfg, s->B, s->T));
    int rc = loco_adamw_init(&opt, loco_gpt_num_params(m), &cfg);
    int n = s->B * s->T;
    int32_t *tok = loco_alloc(((size_t)n + 1) * sizeof(int32_t));
    if (rc < 0 || !tok) {
        loco_gpt_destroy(m);
        loco_free(tok);
        return rc < 0 ? rc : LOCO_ERR(LOCO_ENOMEM, "tokens");
    }
    loco_rng rng;
    loco_rng_seed(&rng, 1);
    loco_gpt_init_weights(m, &rng);
    for (int i = 0; i <= n; i++)
        tok[i] = (int32_t)(loco_rng_u64(&rng) % (uint64_t)s->cfg.vocab_size);
    double total = 0;
    for (int it = 0; it < s->warmup + s->steps && rc == 0; it++) {
        double t0 = loco_now();
        float loss;
        loco_gpt_zero_grad(m);
        rc = loco_gpt_forward_backward(m, tok, tok + 1, s->B, s->T, 1.0f, &loss);
        loco_clip_grad_norm(loco_gpt_grads(m), loco_gpt_num_params(m), 1.0);
        loco_adamw_step(&opt, loco_gpt_table(m), loco_gpt_params(m), loco_gpt_grads(m), 1e-4f);
        if (it >= s->warmup)
            total += loco_now() - t0;
    }
    *step_s = total / s->steps;
    *tok_s = n / *step_s;
    *gflops = loco_gpt_flops_per_token(&s->cfg, s->T) * *tok_s / 1e9;
    loco_free(tok);
    loco_adamw_fini(&opt);
    loco_gpt_destroy(m);
    return rc;
}

int loco_bench_step(int argc, char **argv) {
    int threads = 0, big_steps = 2;
    bool skip_big = false;
    for (int i = 0; i < argc; i++) {
        if (!strcmp(argv[i], "--threads") && i + 1 < argc)
            threads = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--big-steps") && i + 1 < argc)
            big_steps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--tiny-only"))
            skip_big = true;
        else
            return LOCO_ERR(LOCO_EINVAL,
                            "bench step: unknown option '%s' (--threads N, --big-steps N, "
                            "--tiny-only: the two tiny models)",
                            argv[i]);
    }
    int nt = loco_set_threads(threads);
    loco_config d, ll;
    loco_config_defaults(&d);
    /* configs/tiny-llama.ini's model: the defaults' shape with a Llama block */
    loco_config_defaults(&ll);
    LOCO_CHECK(loco_config_set(&ll, "model.arch=llama"));
    LOCO_CHECK(loco_config_set(&ll, "model.n_kv_head=2"));
    LOCO_CHECK(loco_config_set(&ll, "model.rope_theta=10000"));
    shape shapes[] = {
        {"tiny (configs/tiny.ini)", loco_gpt_config_from(&d), (int)d.train.batch_size,
         (int)d.model.seq_len, 2, 10},
        {"tiny-llama (configs/tiny-llama.ini)", loco_gpt_config_from(&ll),
         (int)d.train.batch_size, (int)d.model.seq_len, 2, 10},
        {"GPT-2 124M", {.n_layer = 12, .n_head = 12, .n_embd = 768, .seq_len = 1024,
                        .vocab_size = 50257}, 1, 1024, 1, big_steps > 0 ? big_steps : 1},
    };
    printf("loco bench step: %d thread(s), fp32 CPU path\n", nt);
    double ceiling = sgemm_gflops(2048, 3);
    printf("reference: OpenBLAS sgemm 2048^3 = %.1f GFLOP/s (same run)\n\n", ceiling);
    printf("| model | B x T | params | step s | tokens/s | GFLOP/s | %% of sgemm |\n");
    printf("|---|---|---|---|---|---|---|\n");
    for (int i = 0; i < (skip_big ? 2 : 3); i++) {
        double tok_s = 0, gf = 0, step_s = 0;
        LOCO_CHECK(bench_shape(&shapes[i], &tok_s, &gf, &step_s));
        loco_ttable tt;
        LOCO_CHECK(loco_gpt_build_table(&tt, &shapes[i].cfg));
        printf("| %s | %d x %d | %.1fM | %.3f | %.0f | %.1f | %.0f%% |\n", shapes[i].name,
               shapes[i].B, shapes[i].T, tt.numel / 1e6, step_s, tok_s, gf, 100 * gf / ceiling);
        fflush(stdout);
        loco_ttable_fini(&tt);
    }
    printf("\nFLOPs per token counted as llm.c and PaLM do: 6 x matmul parameters + 12 L C T.\n");
    return 0;
}
