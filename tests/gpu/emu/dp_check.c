/* train.device = cuda with more than one rank, on the emulator: the
 * trainer's multi-rank device code (inner/train.c, device_finish_dp) over
 * the mpi backend, whose collectives are staged through host buffers.
 *
 *   dp_check ref DIR        one rank (backend self), the whole global batch
 *                           (batch_size 4): STEPS + 1 steps' losses and the
 *                           parameters after STEPS into DIR/ref.bin
 *   mpirun -np 2 dp_check dp DIR
 *                           dp = 2 (batch_size 2 each: the same global
 *                           batch), ZeRO 0, 1 and 2: every step's loss and
 *                           the final parameters within 1e-5 relative of
 *                           the reference (max |diff| / max |ref|, as
 *                           tests/parallel/test_zero.c); then a sharded
 *                           checkpoint, resumed into a new trainer, whose
 *                           next step's loss is the reference's step
 *                           STEPS + 1 (the owned AdamW moments went to the
 *                           host and back); ZeRO-3 is refused clearly.
 *
 * Built and run by tests/gpu/emu/run.sh (--filter 'gpu_dp/*'); it prints
 * " N passed, M failed" per rank and exits non-zero on a failure. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "inner/comm/comm.h"
#include "inner/inner.h"
#include "tests/mpi/mpi_check.h"

#ifndef STEPS
#define STEPS 3
#endif
#define TOL 1e-5

static void config(loco_config *cfg, const char *dir, const char *backend, int batch, int zero) {
    loco_config_defaults(cfg);
    cfg->model.n_layer = 2;
    cfg->model.n_head = 2;
    cfg->model.n_embd = 32;
    cfg->model.seq_len = 16;
    cfg->model.vocab_size = 256;
    cfg->train.batch_size = batch;
    cfg->train.steps = STEPS + 1;
    cfg->train.warmup_steps = 2;
    cfg->train.lr = 1e-2;
    cfg->train.grad_clip = 0.5; /* clipping bites: the global norm matters */
    cfg->parallel.dp = strcmp(backend, "self") ? 2 : 1;
    cfg->parallel.zero_stage = zero;
    cfg->parallel.bucket_mb = 0.004; /* several buckets */
    cfg->run.threads = 1;
    cfg->run.log_every = 1000;
    cfg->run.eval_every = 0;
    cfg->data.val[0] = '\0';
    snprintf(cfg->train.device, sizeof cfg->train.device, "cuda");
    snprintf(cfg->parallel.backend, sizeof cfg->parallel.backend, "%s", backend);
    snprintf(cfg->data.train, sizeof cfg->data.train, "%s/train_000000.bin", dir);
    snprintf(cfg->run.dir, sizeof cfg->run.dir, "%s/run-%s-%d", dir, backend, zero);
}

/* A learnable byte stream, as tests/gpu/test_cuda_model.c's. */
static int write_shard(const char *dir) {
    enum { N = 1 << 14 };
    static int32_t tok[N];
    for (size_t p = 0; p < N; p++)
        tok[p] = (int32_t)(((p / 7) * 31 + (p % 7) * 3) % 251);
    char path[512];
    snprintf(path, sizeof path, "%s/train_000000.bin", dir);
    return loco_data_write_shard(path, tok, N, 1);
}

static int die(const char *what) {
    fprintf(stderr, "[rank %d] %s: %s\n", g_rank, what, loco_errmsg());
    return 1;
}

static int reference(const char *dir) {
    if (write_shard(dir) < 0)
        return die("shard");
    loco_config cfg;
    config(&cfg, dir, "self", 4, 0);
    loco_trainer *t;
    if (loco_trainer_create(&t, &cfg, NULL) < 0)
        return die("reference trainer");
    float loss[STEPS + 1];
    for (int i = 0; i <= STEPS; i++) {
        loco_step_stats s;
        if (loco_trainer_step(t, &s) < 0)
            return die("reference step");
        loss[i] = s.loss;
        if (i + 1 == STEPS) { /* the parameters after STEPS */
            const loco_gpt *m = loco_trainer_model(t);
            char path[600];
            snprintf(path, sizeof path, "%s/ref.bin", dir);
            FILE *f = fopen(path, "wb");
            if (!f || fwrite(&m->n_params, sizeof m->n_params, 1, f) != 1 ||
                fwrite(m->params, sizeof(float), m->n_params, f) != m->n_params)
                return die("ref.bin");
            fclose(f);
        }
    }
    char path[600];
    snprintf(path, sizeof path, "%s/ref_loss.bin", dir);
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(loss, sizeof loss, 1, f) != 1)
        return die("ref_loss.bin");
    fclose(f);
    loco_trainer_destroy(t);
    printf("reference: loss %.6f -> %.6f\n", loss[0], loss[STEPS]);
    return 0;
}

static float ref_loss[STEPS + 1];
static float *ref_params;
static size_t ref_n;

static int load_reference(const char *dir) {
    char path[600];
    snprintf(path, sizeof path, "%s/ref_loss.bin", dir);
    FILE *f = fopen(path, "rb");
    if (!f || fread(ref_loss, sizeof ref_loss, 1, f) != 1) {
        fprintf(stderr, "%s: missing or short (run `dp_check ref %s` first)\n", path, dir);
        return -1;
    }
    fclose(f);
    snprintf(path, sizeof path, "%s/ref.bin", dir);
    f = fopen(path, "rb");
    if (!f || fread(&ref_n, sizeof ref_n, 1, f) != 1 || !(ref_params = malloc(ref_n * 4)) ||
        fread(ref_params, 4, ref_n, f) != ref_n) {
        fprintf(stderr, "%s: missing or short\n", path);
        return -1;
    }
    fclose(f);
    return 0;
}

static void check_stage(const char *dir, int zero) {
    loco_config cfg;
    config(&cfg, dir, "mpi", 2, zero);
    loco_trainer *t;
    int rc = loco_trainer_create(&t, &cfg, NULL);
    CHECK(rc == 0, "ZeRO-%d: trainer: %s", zero, loco_errmsg());
    if (rc)
        return;
    CHECK(loco_trainer_ranks(t) == 2, "ZeRO-%d: %d ranks", zero, loco_trainer_ranks(t));
    double worst = 0;
    for (int i = 0; i < STEPS; i++) {
        loco_step_stats s;
        rc = loco_trainer_step(t, &s);
        CHECK(rc == 0, "ZeRO-%d step %d: %s", zero, i + 1, loco_errmsg());
        if (rc)
            goto out;
        const double e = fabs((double)s.loss - ref_loss[i]) / ref_loss[i];
        worst = fmax(worst, e);
        CHECK(e <= TOL, "ZeRO-%d step %d: loss %.7f, one rank %.7f (rel %.3g)", zero, i + 1,
              s.loss, ref_loss[i], e);
    }
    const loco_gpt *m = loco_trainer_model(t);
    CHECK(m->n_params == ref_n, "ZeRO-%d: %zu parameters, reference %zu", zero, m->n_params,
          ref_n);
    double dmax = 0, rmax = 0;
    for (size_t i = 0; i < ref_n && m->n_params == ref_n; i++) {
        dmax = fmax(dmax, fabs((double)m->params[i] - ref_params[i]));
        rmax = fmax(rmax, fabs((double)ref_params[i]));
    }
    CHECK(dmax <= TOL * rmax, "ZeRO-%d: parameters differ by %.3g relative", zero, dmax / rmax);
    /* Sharded checkpoint; a new trainer resumes it: the next step is the
     * reference's (moments, step count and data position came back). */
    char ck[700];
    snprintf(ck, sizeof ck, "%s/ckpt", cfg.run.dir);
    rc = loco_trainer_save(t, ck);
    CHECK(rc == 0, "ZeRO-%d: save: %s", zero, loco_errmsg());
    loco_trainer_destroy(t);
    t = NULL;
    if (rc)
        return;
    rc = loco_trainer_create(&t, &cfg, ck);
    CHECK(rc == 0, "ZeRO-%d: resume: %s", zero, loco_errmsg());
    if (rc)
        return;
    loco_step_stats s;
    rc = loco_trainer_step(t, &s);
    CHECK(rc == 0, "ZeRO-%d resumed step: %s", zero, loco_errmsg());
    const double e = fabs((double)s.loss - ref_loss[STEPS]) / ref_loss[STEPS];
    CHECK(rc == 0 && e <= TOL, "ZeRO-%d resumed step %d: loss %.7f, one rank %.7f (rel %.3g)",
          zero, STEPS + 1, s.loss, ref_loss[STEPS], e);
    if (g_rank == 0)
        printf("dp=2 ZeRO-%d (mpi, staged): worst loss rel diff %.3g, parameters %.3g, "
               "resumed step rel diff %.3g\n",
               zero, worst, dmax / rmax, e);
out:
    loco_trainer_destroy(t);
}

int main(int argc, char **argv) {
    if (argc != 3 || (strcmp(argv[1], "ref") && strcmp(argv[1], "dp"))) {
        fprintf(stderr, "usage: dp_check ref|dp DIR\n");
        return 2;
    }
    if (!strcmp(argv[1], "ref"))
        return reference(argv[2]);
    /* Keeps MPI initialised across the trainers (each destroys its world). */
    loco_comm *keep;
    if (loco_comm_world(&keep, "mpi") < 0)
        return die("mpi world");
    g_rank = loco_comm_rank(keep);
    if (loco_comm_size(keep) != 2) {
        fprintf(stderr, "run under mpirun -np 2\n");
        return 2;
    }
    if (load_reference(argv[2]) < 0)
        return 1;
    for (int zero = 0; zero <= 2; zero++)
        check_stage(argv[2], zero);
    loco_config cfg;
    config(&cfg, argv[2], "mpi", 2, 3);
    loco_trainer *t = NULL;
    const int rc = loco_trainer_create(&t, &cfg, NULL);
    CHECK(rc == LOCO_ENOTSUP && strstr(loco_errmsg(), "parallel.zero_stage = 3 with train.device"),
          "ZeRO-3 on the device over 2 ranks: rc %d, %s", rc, loco_errmsg());
    loco_trainer_destroy(t);
    free(ref_params);
    printf("[rank %d] %ld passed, %ld failed\n", g_rank, n_pass, n_fail);
    loco_comm_destroy(keep);
    return n_fail ? 1 : 0;
}
