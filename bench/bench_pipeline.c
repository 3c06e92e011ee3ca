/* `loco bench pipeline [CONFIG] [--set k=v]... [--synthetic-ms F,B,W]
 * [--steps N] [--warmup N] [--msg-elems N]`, under `mpirun -np p`: the
 * pipeline executor running every schedule (or the one --set
 * parallel.pp_schedule names) in synthetic mode: each compute callback
 * sleeps for its cost (clock_nanosleep: the ranks may outnumber the
 * cores), the messages are real, msg_elems floats (the config's
 * batch_size * seq_len * n_embd, or --msg-elems). The measured step time
 * and bubble stand beside the simulator's for the same costs and the
 * per-message latency measured here first. docs/PERFORMANCE.md,
 * "pipeline executor, synthetic". */
#include "bench/bench.h"
#include "core/core.h"
#include "inner/parallel/parallel.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* Defaults: m when parallel.microbatches is 0, and the run's length. */
#define BENCH_PP_MICRO 8
#define BENCH_PP_WARMUP 2
#define BENCH_PP_STEPS 5
#define BENCH_PP_PINGS 20
/* How often a rank that waits outside the executor looks (seconds): it
 * sleeps in between instead of spinning in MPI on a shared core. */
#define BENCH_PP_POLL 0.0005

typedef struct {
    double f, b, w; /* seconds */
} synth;

static void sleep_for(double s) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    const double ns = (double)t.tv_nsec + s * 1e9;
    t.tv_sec += (time_t)(ns / 1e9);
    t.tv_nsec = (long)fmod(ns, 1e9);
    while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &t, NULL) == EINTR)
        ;
}

static int syn_forward(void *ctx, int mb, int chunk, const float *in, float *out) {
    sleep_for(((const synth *)ctx)->f);
    return 0;
}
static int syn_backward_input(void *ctx, int mb, int chunk, const float *dout, float *din) {
    sleep_for(((const synth *)ctx)->b);
    return 0;
}
static int syn_backward_weight(void *ctx, int mb, int chunk) {
    sleep_for(((const synth *)ctx)->w);
    return 0;
}

/* Completes req, sleeping between looks. */
static int wait_sleeping(loco_comm_req *req) {
    for (bool done = false; !done;) {
        LOCO_CHECK(loco_comm_test(req, &done));
        if (!done)
            sleep_for(BENCH_PP_POLL);
    }
    return loco_comm_wait(req);
}

/* Barrier of the bench: rank 0 collects a token from every rank, then
 * releases them; everyone sleeps while waiting. */
static int quiet_barrier(loco_comm *c) {
    const int me = loco_comm_rank(c), p = loco_comm_size(c);
    float token = 0;
    loco_comm_req *req;
    for (int r = 1; r < p && me == 0; r++) {
        LOCO_CHECK(loco_comm_irecv(c, &token, 1, LOCO_DT_F32, r, 1, &req));
        LOCO_CHECK(wait_sleeping(req));
    }
    for (int r = 1; r < p && me == 0; r++)
        LOCO_CHECK(loco_comm_send(c, &token, 1, LOCO_DT_F32, r, 2));
    if (me > 0) {
        LOCO_CHECK(loco_comm_send(c, &token, 1, LOCO_DT_F32, 0, 1));
        LOCO_CHECK(loco_comm_irecv(c, &token, 1, LOCO_DT_F32, 0, 2, &req));
        LOCO_CHECK(wait_sleeping(req));
    }
    return 0;
}

/* One-way time of a message of n floats between ranks 0 and 1 (half the
 * mean round trip), on every rank. */
static int measure_latency(loco_comm *c, size_t n, double *latency) {
    const int me = loco_comm_rank(c);
    float *buf = loco_alloc(n * sizeof(float));
    if (!buf)
        return LOCO_ERR(LOCO_ENOMEM, "bench pipeline: ping buffer");
    int rc = 0;
    double t = 0;
    for (int i = -2; i < BENCH_PP_PINGS && rc == 0 && me < 2; i++) {
        const double t0 = loco_now();
        if (me == 0) {
            rc = loco_comm_send(c, buf, n, LOCO_DT_F32, 1, 3);
            if (rc == 0)
                rc = loco_comm_recv(c, buf, n, LOCO_DT_F32, 1, 3);
        } else {
            rc = loco_comm_recv(c, buf, n, LOCO_DT_F32, 0, 3);
            if (rc == 0)
                rc = loco_comm_send(c, buf, n, LOCO_DT_F32, 0, 3);
        }
        if (i >= 0)
            t += loco_now() - t0;
    }
    loco_free(buf);
    LOCO_CHECK(rc);
    *latency = t / BENCH_PP_PINGS / 2;
    LOCO_CHECK(quiet_barrier(c));
    return loco_comm_broadcast(c, latency, 1, LOCO_DT_F64, 0);
}

/* Runs warmup + steps steps of e; per rank the mean compute and the mean
 * over steps of the slowest rank's wall (every rank gets it). */
static int run_steps(loco_comm *c, loco_pp_exec *e, const synth *cost, int warmup, int steps,
                     double *step_time, double *compute) {
    const loco_pp_stage_ops ops = {.ctx = (void *)cost,
                                   .forward = syn_forward,
                                   .backward_input = syn_backward_input,
                                   .backward_weight = syn_backward_weight};
    *step_time = *compute = 0;
    for (int k = 0; k < warmup + steps; k++) {
        loco_pp_exec_stats st;
        LOCO_CHECK(quiet_barrier(c));
        LOCO_CHECK(loco_pp_execute(e, &ops, &st));
        double wall = st.wall;
        LOCO_CHECK(loco_comm_allreduce(c, &wall, 1, LOCO_DT_F64, LOCO_OP_MAX));
        if (k >= warmup)
            *step_time += wall / steps, *compute += st.compute / steps;
    }
    return 0;
}

/* This thread's error message without its "file:line: " prefix. */
static const char *short_error(void) {
    const char *m = loco_errmsg(), *colon = strstr(m, ": ");
    return colon ? colon + 2 : m;
}

/* One row of the table: schedule name at (p, m) with its v. */
static int bench_row(loco_comm *c, const char *name, int v, int m, size_t elems, const synth *cost,
                     int warmup, int steps, double latency) {
    const int p = loco_comm_size(c), me = loco_comm_rank(c);
    loco_pp_schedule *s;
    int rc = loco_pp_schedule_create(&s, name, p, v, m);
    if (rc == LOCO_EINVAL) {
        if (me == 0)
            printf("| %s | %d | %d | — | — | — | — | — | — | — | refused: %s |\n", name, v, m,
                   short_error());
        return 0;
    }
    LOCO_CHECK(rc);
    loco_pp_exec *e = NULL;
    loco_pp_sim sim = {0};
    double step, compute, bubble, buffers;
    const loco_pp_costs sc = {.f = cost->f, .b = cost->b, .w = cost->w, .latency = latency};
    LOCO_CHECK_GOTO(loco_pp_simulate(s, &sc, &sim), out);
    LOCO_CHECK_GOTO(loco_pp_exec_create(&e, s, c, elems), out);
    LOCO_CHECK_GOTO(run_steps(c, e, cost, warmup, steps, &step, &compute), out);
    /* The mean over ranks of their bubble in the step, 1 - compute / step;
     * the compute beside its nominal m v (F + B + W). */
    double sums[2] = {(1 - compute / step) / p,
                      compute / (m * v * (cost->f + cost->b + cost->w)) / p};
    buffers = loco_pp_exec_buffers(e);
    LOCO_CHECK_GOTO(loco_comm_allreduce(c, sums, 2, LOCO_DT_F64, LOCO_OP_SUM), out);
    LOCO_CHECK_GOTO(loco_comm_allreduce(c, &buffers, 1, LOCO_DT_F64, LOCO_OP_MAX), out);
    bubble = sums[0];
    if (me == 0)
        printf("| %s | %d | %d | %.0f | %.1f | %.1f | %+.2f%% | %.4f | %.4f | %+.2f%% | |\n", name,
               v, m, buffers, step * 1e3, sim.makespan * 1e3,
               100 * (step - sim.makespan) / sim.makespan, bubble, sim.bubble, 100 * (sums[1] - 1));
out:
    loco_pp_sim_fini(&sim);
    loco_pp_exec_destroy(e);
    loco_pp_schedule_destroy(s);
    return rc;
}

typedef struct {
    const char *path;
    const char *only; /* --set parallel.pp_schedule=X: that schedule alone */
    synth cost;
    int warmup, steps;
    long long msg_elems; /* 0: from the config */
} bench_args;

/* "F,B,W" in milliseconds, three numbers >= 0, into seconds. */
static bool parse_ms(const char *s, synth *c) {
    loco_pp_costs ms;
    if (!loco_pp_parse_costs(s, &ms))
        return false;
    *c = (synth){ms.f / 1e3, ms.b / 1e3, ms.w / 1e3};
    return true;
}

static int parse_count(const char *flag, const char *s, long long lo, long long *out) {
    char *end;
    const long long x = strtoll(s, &end, 10);
    if (end == s || *end || x < lo)
        return LOCO_ERR(LOCO_EINVAL, "bench pipeline: %s expects an integer >= %lld, got '%s'",
                        flag, lo, s);
    *out = x;
    return 0;
}

static int parse_args(int argc, char **argv, loco_config *cfg, bench_args *a) {
    *a = (bench_args){
        .cost = {0.010, 0.010, 0.010}, .warmup = BENCH_PP_WARMUP, .steps = BENCH_PP_STEPS};
    loco_config_defaults(cfg);
    for (int i = 0; i < argc; i++) {
        long long x = 0;
        if (!strcmp(argv[i], "--set") && i + 1 < argc) {
            LOCO_CHECK(loco_config_set(cfg, argv[++i]));
            if (!strncmp(argv[i], "parallel.pp_schedule=", 21))
                a->only = cfg->parallel.pp_schedule;
        } else if (!strcmp(argv[i], "--synthetic-ms") && i + 1 < argc) {
            if (!parse_ms(argv[++i], &a->cost))
                return LOCO_ERR(LOCO_EINVAL,
                                "bench pipeline: --synthetic-ms expects F,B,W "
                                "(three numbers >= 0, milliseconds), got '%s'",
                                argv[i]);
        } else if (!strcmp(argv[i], "--steps") && i + 1 < argc) {
            LOCO_CHECK(parse_count("--steps", argv[++i], 1, &x));
            a->steps = (int)(x < 100000 ? x : 100000);
        } else if (!strcmp(argv[i], "--warmup") && i + 1 < argc) {
            LOCO_CHECK(parse_count("--warmup", argv[++i], 0, &x));
            a->warmup = (int)(x < 100000 ? x : 100000);
        } else if (!strcmp(argv[i], "--msg-elems") && i + 1 < argc) {
            LOCO_CHECK(parse_count("--msg-elems", argv[++i], 0, &a->msg_elems));
        } else if (argv[i][0] != '-' && !a->path && i == 0) {
            a->path = argv[i];
            LOCO_CHECK(loco_config_load(cfg, a->path));
        } else {
            return LOCO_ERR(LOCO_EINVAL,
                            "bench pipeline: unexpected argument '%s' ([CONFIG] [--set k=v]... "
                            "[--synthetic-ms F,B,W] [--steps N] [--warmup N] [--msg-elems N])",
                            argv[i]);
        }
    }
    return loco_config_validate(cfg);
}

int loco_bench_pipeline(int argc, char **argv) {
    loco_config cfg;
    bench_args a;
    LOCO_CHECK(parse_args(argc, argv, &cfg, &a));
    loco_comm *c = NULL;
    int rc;
    LOCO_CHECK_GOTO(loco_comm_world(&c, cfg.parallel.backend), out);
    const int p = loco_comm_size(c);
    if (p < 2 || (cfg.parallel.pp > 1 && cfg.parallel.pp != p)) {
        rc = LOCO_ERR(LOCO_EINVAL,
                      "bench pipeline: run it under mpirun -np p with p >= 2 pipeline ranks "
                      "(%d rank%s here, parallel.pp = %lld)",
                      p, p == 1 ? "" : "s", (long long)cfg.parallel.pp);
        goto out;
    }
    const int m = cfg.parallel.microbatches ? (int)cfg.parallel.microbatches : BENCH_PP_MICRO;
    const int v_cfg = cfg.parallel.virtual_stages > 2 ? (int)cfg.parallel.virtual_stages : 2;
    const size_t elems =
        a.msg_elems ? (size_t)a.msg_elems
                    : (size_t)(cfg.train.batch_size * cfg.model.seq_len * cfg.model.n_embd);
    double latency;
    LOCO_CHECK_GOTO(measure_latency(c, elems + 1, &latency), out);
    if (loco_comm_rank(c) == 0) {
        printf("loco bench pipeline: p = %d ranks, m = %d micro-batches, synthetic F %g ms, "
               "B %g ms, W %g ms per chunk (sleeps), messages of %zu floats (%.2f MB), "
               "measured latency %.3f ms per message; %d warm-up + %d measured steps\n"
               "step: the slowest rank's time from a common start, mean over steps; bubble: "
               "mean over ranks of 1 - compute / step; simulator: loco_pp_simulate with these "
               "costs and latency; compute: the time in the sleeps beside their nominal total\n\n",
               p, m, a.cost.f * 1e3, a.cost.b * 1e3, a.cost.w * 1e3, elems,
               (double)(elems + 1) * 4 / 1e6, latency * 1e3, a.warmup, a.steps);
        printf("| schedule | v | m | buffers | step ms | step ms (sim) | diff | bubble | "
               "bubble (sim) | compute vs nominal | note |\n"
               "|---|---|---|---|---|---|---|---|---|---|---|\n");
    }
    for (int k = 0; loco_pp_generator_name(k) && rc == 0; k++) {
        const char *name = loco_pp_generator_name(k);
        if (a.only && strcmp(a.only, name))
            continue;
        const int v = !strcmp(name, "interleaved")                         ? v_cfg
                      : !strcmp(name, "zbv") || !strcmp(name, "dualpipev") ? 2
                                                                           : 1;
        LOCO_CHECK_GOTO(bench_row(c, name, v, m, elems, &a.cost, a.warmup, a.steps, latency), out);
    }
out:
    loco_comm_destroy(c);
    return rc;
}
