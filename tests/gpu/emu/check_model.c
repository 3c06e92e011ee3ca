/* One training step of bench/gpu/gpt2_gpu.c (bf16, every CUDA twin in the
 * model's order) on a tiny GPT-2, against the CPU model of inner/ on the
 * same bf16-rounded weights and tokens: the loss and every parameter
 * gradient. Built by tests/gpu/emu/run.sh over the emulated twins; it could
 * link the real ones as well. Exit status 1 when a gradient is off by more
 * than 2e-2 relative (bf16 activations) or the loss by more than 1e-3. */
#define main bench_main
#include "bench/gpu/gpt2_gpu.c"
#undef main

static float bf16_round(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    u = ((u + 0x7fffU + ((u >> 16) & 1)) >> 16) << 16;
    memcpy(&f, &u, 4);
    return f;
}

int main(void) {
    gpu_model g;
    memset(&g, 0, sizeof g);
    g.o = (opts){.B = 2, .T = 16, .L = 2, .NH = 2, .C = 32, .V = 128, .steps = 1, .lr = 0.0,
                 .peak_tflops = 1.0};
    if (setup(&g) < 0 || load_batch(&g, NULL, 0, 3) < 0) {
        fprintf(stderr, "check_model: %s\n", loco_errmsg());
        return 1;
    }
    const size_t P = g.P, N = (size_t)g.o.B * g.o.T;
    float *w = malloc(P * 4), *gr = malloc(P * 4);
    int32_t *in = malloc(N * 4), *tg = malloc(N * 4);
    float loss = 0, cpu_loss = 0;
    loco_gpt m;
    int rc = loco_cuda_copy(w, g.params, P * 4, NULL);
    rc = rc ? rc : loco_cuda_copy(in, g.inputs, N * 4, NULL);
    rc = rc ? rc : loco_cuda_copy(tg, g.targets, N * 4, NULL);
    rc = rc ? rc : step(&g, &loss, 1); /* lr 0: the weights stay */
    rc = rc ? rc : loco_cuda_copy(gr, g.grads, P * 4, NULL);
    rc = rc ? rc : loco_cuda_sync(NULL);
    rc = rc ? rc : loco_gpt_init(&m, &g.cfg, g.o.B, g.o.T);
    if (rc < 0) {
        fprintf(stderr, "check_model: %s\n", loco_errmsg());
        return 1;
    }
    for (size_t i = 0; i < P; i++) /* the CPU sees the GPU's bf16 weight copy */
        m.params[i] = bf16_round(w[i]);
    loco_gpt_zero_grad(&m);
    if (loco_gpt_forward_backward(&m, in, tg, g.o.B, g.o.T, 1.0f, &cpu_loss) < 0) {
        fprintf(stderr, "check_model: %s\n", loco_errmsg());
        return 1;
    }
    int bad = fabsf(loss - cpu_loss) > 1e-3f * cpu_loss;
    printf("loss: gpu (bf16) %.5f, cpu %.5f\n", loss, cpu_loss);
    for (int i = 0; i < g.tt.n; i++) {
        const loco_tensor *t = &g.tt.t[i];
        double num = 0, den = 0;
        for (size_t k = 0; k < t->numel; k++) {
            num = fmax(num, fabs((double)gr[t->offset + k] - m.grads[t->offset + k]));
            den = fmax(den, fabs((double)m.grads[t->offset + k]));
        }
        const double e = num / (den + 1e-12);
        bad |= e > 2e-2;
        printf("  %-36s grad rel err %.3g%s\n", t->name, e, e > 2e-2 ? "  TOO LARGE" : "");
    }
    printf("check_model: %s\n", bad ? "FAILED" : "ok");
    loco_gpt_fini(&m);
    teardown(&g);
    free(w), free(gr), free(in), free(tg);
    return bad;
}
