/* Pipeline schedules as data (inner/parallel/schedule.c): every generator
 * at p in {2, 4, 8}, m in {p, 2p, 4p} passes the simulator and runs each
 * (micro-batch, chunk) once on the rank that holds it; the simulated bubble
 * and peak activations equal the closed forms of the papers, computed here
 * independently; broken lists (a deleted SEND, a cycle, misplaced actions)
 * are refused with the rank, the action and what it waits for; bad shapes
 * and failed allocations give clear errors. */
#include "inner/parallel/parallel.h"
#include "tests/support.h"

#include <criterion/criterion.h>
#include <math.h>
#include <string.h>

/* The loco of the build under test (make asan sets LOCO_BIN). */
#define LOCO "\"${LOCO_BIN:-build/loco}\""

static const char *const names[] = {"gpipe", "1f1b", "interleaved", "zb-h1", "zbv", "dualpipev"};
#define N_NAMES (int)(sizeof names / sizeof names[0])
static const int ps[] = {2, 4, 8};
static const loco_pp_costs unit = {.f = 1, .b = 1, .w = 1};

static int chunks_per_rank(const char *name) {
    return !strcmp(name, "interleaved") || !strcmp(name, "zbv") || !strcmp(name, "dualpipev") ? 2
                                                                                              : 1;
}

static bool v_shaped(const char *name) {
    return !strcmp(name, "zbv") || !strcmp(name, "dualpipev");
}

static loco_pp_schedule *make(const char *name, int p, int v, int m) {
    loco_pp_schedule *s = NULL;
    int rc = loco_pp_schedule_create(&s, name, p, v, m);
    cr_assert_eq(rc, 0, "%s p=%d v=%d m=%d: %s", name, p, v, m, loco_errmsg());
    return s;
}

static loco_pp_sim simulate(const loco_pp_schedule *s, const loco_pp_costs *c) {
    loco_pp_sim r;
    int rc = loco_pp_simulate(s, c, &r);
    cr_assert_eq(rc, 0, "%s: %s", loco_pp_schedule_name(s), loco_errmsg());
    return r;
}

/* Counts, from the lists alone, how often each (mb, chunk) is computed and
 * checks each action sits on the rank its placement names. */
static void check_lists(const loco_pp_schedule *s, const char *name) {
    int p, v, m;
    loco_pp_schedule_shape(s, &p, &v, &m);
    const int C = p * v;
    int *f = calloc((size_t)(m * C), sizeof(int)), *b = calloc((size_t)(m * C), sizeof(int));
    int *w = calloc((size_t)(m * C), sizeof(int)), *bw = calloc((size_t)(m * C), sizeof(int));
    int sends = 0, recvs = 0;
    cr_assert(f && b && w && bw);
    for (int r = 0; r < p; r++) {
        int n;
        const loco_pp_action *a = loco_pp_rank_actions(s, r, &n);
        for (int i = 0; i < n; i++) {
            if (a[i].op == LOCO_PP_SEND || a[i].op == LOCO_PP_RECV) {
                *(a[i].op == LOCO_PP_SEND ? &sends : &recvs) += 1;
                cr_assert_neq(a[i].peer, r);
                continue;
            }
            const int c = a[i].chunk, home = v_shaped(name) ? (c < p ? c : 2 * p - 1 - c) : c % p;
            cr_assert_eq(home, r, "%s: rank %d computes chunk %d", name, r, c);
            int *count[] = {f, b, w, bw};
            count[a[i].op][a[i].mb * C + c]++;
        }
    }
    for (int u = 0; u < m * C; u++) {
        cr_assert_eq(f[u], 1, "%s p=%d m=%d: F of unit %d x%d", name, p, m, u, f[u]);
        cr_assert((bw[u] == 1 && !b[u] && !w[u]) || (!bw[u] && b[u] == 1 && w[u] == 1),
                  "%s: unit %d backward BW %d B %d W %d", name, u, bw[u], b[u], w[u]);
    }
    cr_assert_eq(sends, recvs, "%s: %d sends, %d receives", name, sends, recvs);
    free(f), free(b), free(w), free(bw);
}

TestSuite(schedule, .timeout = 60);

Test(schedule, every_schedule_simulates) {
    for (int k = 0; k < N_NAMES; k++)
        for (int i = 0; i < 3; i++)
            for (int mult = 1; mult <= 4; mult *= 2) {
                const int p = ps[i], m = mult * p, v = chunks_per_rank(names[k]);
                loco_pp_schedule *s = NULL;
                int rc = loco_pp_schedule_create(&s, names[k], p, v, m);
                if (!strcmp(names[k], "dualpipev") && m < 2 * p) {
                    cr_assert_eq(rc, LOCO_EINVAL, "dualpipev m=%d p=%d", m, p);
                    continue;
                }
                cr_assert_eq(rc, 0, "%s p=%d m=%d: %s", names[k], p, m, loco_errmsg());
                check_lists(s, names[k]);
                loco_pp_sim r = simulate(s, &unit);
                cr_assert(r.makespan > 0 && r.bubble >= 0 && r.bubble < 1);
                /* a channel per rank pair and kind sees its messages in
                 * order; per pair alone only without the V */
                cr_assert(r.in_order_by_kind, "%s p=%d m=%d", names[k], p, m);
                cr_assert(r.in_order || v_shaped(names[k]), "%s p=%d m=%d", names[k], p, m);
                loco_pp_sim_fini(&r);
                loco_pp_schedule_destroy(s);
            }
}

/* GPipe and 1F1B: (p-1)/(m+p-1) on every rank, for equal and unequal costs. */
Test(schedule, flush_bubble_formula) {
    const loco_pp_costs costs[] = {{.f = 1, .b = 1, .w = 1}, {.f = 1, .b = 1.5, .w = 0.7}};
    for (int k = 0; k < 2; k++)
        for (int c = 0; c < 2; c++)
            for (int i = 0; i < 3; i++)
                for (int mult = 1; mult <= 4; mult *= 2) {
                    const int p = ps[i], m = mult * p;
                    loco_pp_schedule *s = make(names[k], p, 1, m);
                    loco_pp_sim r = simulate(s, &costs[c]);
                    const double want = (double)(p - 1) / (m + p - 1);
                    for (int q = 0; q < p; q++)
                        cr_assert(fabs(r.ranks[q].bubble - want) < 1e-9,
                                  "%s p=%d m=%d rank %d: bubble %.12f, want %.12f", names[k], p, m,
                                  q, r.ranks[q].bubble, want);
                    loco_pp_sim_fini(&r);
                    loco_pp_schedule_destroy(s);
                }
}

/* 1F1B keeps p - r micro-batches on rank r (p on rank 0), GPipe all m. */
Test(schedule, flush_peak_activations) {
    for (int i = 0; i < 3; i++)
        for (int mult = 1; mult <= 4; mult *= 2) {
            const int p = ps[i], m = mult * p;
            loco_pp_schedule *s = make("1f1b", p, 1, m), *g = make("gpipe", p, 1, m);
            loco_pp_sim r = simulate(s, &unit), rg = simulate(g, &unit);
            cr_assert_eq(r.ranks[0].peak_live, p, "1f1b p=%d m=%d", p, m);
            for (int q = 0; q < p; q++) {
                cr_assert_eq(r.ranks[q].peak_live, p - q);
                cr_assert_eq(rg.ranks[q].peak_live, m, "gpipe p=%d m=%d rank %d", p, m, q);
            }
            loco_pp_sim_fini(&r), loco_pp_sim_fini(&rg);
            loco_pp_schedule_destroy(s), loco_pp_schedule_destroy(g);
        }
}

/* Interleaved: (p-1)/(vm + p-1), and rank 0 holds 2(p-1) + (v-1)p + 1
 * chunks' activations (Megatron-LM's warm-up plus one), at most vm. */
Test(schedule, interleaved_formula) {
    const loco_pp_costs costs[] = {{.f = 1, .b = 1, .w = 1}, {.f = 1, .b = 1.5, .w = 0.7}};
    for (int v = 2; v <= 4; v += 2)
        for (int c = 0; c < 2; c++)
            for (int i = 0; i < 3; i++)
                for (int mult = 1; mult <= 4; mult *= 2) {
                    const int p = ps[i], m = mult * p;
                    loco_pp_schedule *s = make("interleaved", p, v, m);
                    loco_pp_sim r = simulate(s, &costs[c]);
                    const double want = (double)(p - 1) / ((double)v * m + p - 1);
                    const int peak = 2 * (p - 1) + (v - 1) * p + 1;
                    cr_assert(fabs(r.bubble - want) < 1e-9, "p=%d v=%d m=%d: %.12f, want %.12f", p,
                              v, m, r.bubble, want);
                    cr_assert_eq(r.ranks[0].peak_live, peak < v * m ? peak : v * m,
                                 "p=%d v=%d m=%d", p, v, m);
                    loco_pp_sim_fini(&r);
                    loco_pp_schedule_destroy(s);
                }
}

/* ZB-H1 at T_F = T_B = T_W: bubble (p-1)(T_F + T_B - T_W), a third of
 * 1F1B's, with 1F1B's peak p on every rank (B done, W pending counted). */
Test(schedule, zbh1_below_1f1b) {
    for (int i = 0; i < 3; i++)
        for (int mult = 1; mult <= 4; mult *= 2) {
            const int p = ps[i], m = mult * p;
            loco_pp_schedule *z = make("zb-h1", p, 1, m), *o = make("1f1b", p, 1, m);
            loco_pp_sim rz = simulate(z, &unit), ro = simulate(o, &unit);
            cr_assert_lt(rz.bubble, ro.bubble, "p=%d m=%d", p, m);
            const double idle = (p - 1) * (unit.f + unit.b - unit.w);
            cr_assert(fabs(rz.makespan - (m * 3 + idle)) < 1e-9, "p=%d m=%d: makespan %g", p, m,
                      rz.makespan);
            for (int q = 0; q < p; q++)
                cr_assert_eq(rz.ranks[q].peak_live, p, "p=%d m=%d rank %d", p, m, q);
            loco_pp_sim_fini(&rz), loco_pp_sim_fini(&ro);
            loco_pp_schedule_destroy(z), loco_pp_schedule_destroy(o);
        }
}

/* ZB-V at equal costs and m >= 2p-1: every rank busy without a gap from
 * its first action to its last (the paper's zero bubble: a parallelogram),
 * with 2p chunk activations (1F1B's p whole-rank ones). */
Test(schedule, zbv_parallelogram) {
    for (int i = 0; i < 3; i++)
        for (int mult = 2; mult <= 4; mult *= 2) {
            const int p = ps[i], m = mult * p;
            loco_pp_schedule *s = make("zbv", p, 2, m);
            loco_pp_sim r = simulate(s, &unit);
            for (int q = 0; q < p; q++) {
                const loco_pp_rank_stats *st = &r.ranks[q];
                cr_assert(fabs(st->end - st->start - st->busy) < 1e-9, "p=%d m=%d rank %d", p, m,
                          q);
                cr_assert_eq(st->peak_live, 2 * p, "p=%d m=%d rank %d", p, m, q);
            }
            loco_pp_sim_fini(&r);
            loco_pp_schedule_destroy(s);
        }
}

/* DualPipeV: PP + 1 = 2p + 1 chunk activations (DualPipe's README), below
 * 1F1B's bubble at equal costs. */
Test(schedule, dualpipev_memory_and_bubble) {
    for (int i = 0; i < 3; i++)
        for (int mult = 2; mult <= 4; mult *= 2) {
            const int p = ps[i], m = mult * p;
            loco_pp_schedule *s = make("dualpipev", p, 2, m), *o = make("1f1b", p, 1, m);
            loco_pp_sim r = simulate(s, &unit), ro = simulate(o, &unit);
            cr_assert_eq(r.peak_live, 2 * p + 1, "p=%d m=%d", p, m);
            cr_assert_lt(r.bubble, ro.bubble, "p=%d m=%d", p, m);
            loco_pp_sim_fini(&r), loco_pp_sim_fini(&ro);
            loco_pp_schedule_destroy(s), loco_pp_schedule_destroy(o);
        }
}

/* Two ranks, one micro-batch: F, latency, F, BW, latency, BW. */
Test(schedule, latency_on_the_critical_path) {
    loco_pp_schedule *s = make("gpipe", 2, 1, 1);
    const loco_pp_costs c = {.f = 1, .b = 1.5, .w = 0.5, .latency = 0.25};
    loco_pp_sim r = simulate(s, &c);
    cr_assert(fabs(r.makespan - (1 + 0.25 + 1 + 2 + 0.25 + 2)) < 1e-12, "makespan %g", r.makespan);
    cr_assert(r.in_order);
    loco_pp_sim_fini(&r);
    loco_pp_schedule_destroy(s);
}

/* A copy of s's lists with rank `drop_rank`'s action `drop_idx` removed
 * (-1: none), simulated; returns the status. */
static int simulate_edited(const loco_pp_schedule *s, int drop_rank, int drop_idx) {
    int p, v, m;
    loco_pp_schedule_shape(s, &p, &v, &m);
    loco_pp_action *lists[8];
    int lens[8], place[16];
    cr_assert(p <= 8);
    for (int c = 0; c < p * v; c++)
        place[c] = loco_pp_chunk_rank(s, c);
    for (int r = 0; r < p; r++) {
        int n;
        const loco_pp_action *a = loco_pp_rank_actions(s, r, &n);
        lists[r] = malloc(sizeof(loco_pp_action) * (size_t)n + 1);
        lens[r] = 0;
        for (int i = 0; i < n; i++)
            if (r != drop_rank || i != drop_idx)
                lists[r][lens[r]++] = a[i];
    }
    loco_pp_schedule *e;
    cr_assert_eq(loco_pp_schedule_from_lists(&e, "edited", p, v, m, place,
                                             (const loco_pp_action *const *)lists, lens),
                 0);
    loco_pp_sim r;
    int rc = loco_pp_simulate(e, &unit, &r);
    if (rc == 0)
        loco_pp_sim_fini(&r);
    loco_pp_schedule_destroy(e);
    for (int q = 0; q < p; q++)
        free(lists[q]);
    return rc;
}

/* Index of rank r's first action with this op, message, mb and chunk. */
static int find(const loco_pp_schedule *s, int r, int op, int msg, int mb, int chunk) {
    int n;
    const loco_pp_action *a = loco_pp_rank_actions(s, r, &n);
    for (int i = 0; i < n; i++)
        if (a[i].op == op && a[i].mb == mb && a[i].chunk == chunk &&
            (op < LOCO_PP_SEND || a[i].msg == msg))
            return i;
    cr_assert_fail("rank %d has no such action", r);
    return -1;
}

Test(schedule, deleted_send_is_named) {
    loco_pp_schedule *s = make("1f1b", 4, 1, 4);
    cr_assert_eq(simulate_edited(s, -1, -1), 0, "%s", loco_errmsg());
    const int send = find(s, 1, LOCO_PP_SEND, LOCO_PP_ACT, 2, 1);
    const int f = find(s, 2, LOCO_PP_F, 0, 2, 2),
              recv = find(s, 2, LOCO_PP_RECV, LOCO_PP_ACT, 2, 1);
    cr_assert_eq(simulate_edited(s, 1, send), LOCO_EINVAL);
    char want[256];
    snprintf(want, sizeof want,
             "rank 2 action %d (F2.2) waits forever on its RECV (action %d, Ra2.1<1) of the "
             "activation of (mb 2, chunk 1): rank 1's list has no matching SEND",
             f, recv);
    cr_assert(strstr(loco_errmsg(), want), "got: %s\nwant: %s", loco_errmsg(), want);
    loco_pp_schedule_destroy(s);
}

Test(schedule, deleted_recv_is_named) {
    loco_pp_schedule *s = make("zb-h1", 2, 1, 2);
    const int recv = find(s, 0, LOCO_PP_RECV, LOCO_PP_GRAD, 1, 1),
              b = find(s, 0, LOCO_PP_B, 0, 1, 0);
    cr_assert_eq(simulate_edited(s, 0, recv), LOCO_EINVAL);
    char want[256];
    snprintf(want, sizeof want,
             "rank 0 action %d (B1.0) waits forever for the gradient of (mb 1, chunk 1) from rank "
             "1: rank 0's list has no RECV of it",
             b - 1);
    cr_assert(strstr(loco_errmsg(), want), "got: %s\nwant: %s", loco_errmsg(), want);
    loco_pp_schedule_destroy(s);
}

/* Rank 0 sends its activation only after its backward, which waits for
 * rank 1's gradient, which waits for that activation. */
Test(schedule, cycle_is_named) {
    const loco_pp_action r0[] = {
        {.op = LOCO_PP_F, .peer = -1, .mb = 0, .chunk = 0},
        {.op = LOCO_PP_RECV, .msg = LOCO_PP_GRAD, .peer = 1, .mb = 0, .chunk = 1},
        {.op = LOCO_PP_BW, .peer = -1, .mb = 0, .chunk = 0},
        {.op = LOCO_PP_SEND, .msg = LOCO_PP_ACT, .peer = 1, .mb = 0, .chunk = 0},
    };
    const loco_pp_action r1[] = {
        {.op = LOCO_PP_RECV, .msg = LOCO_PP_ACT, .peer = 0, .mb = 0, .chunk = 0},
        {.op = LOCO_PP_F, .peer = -1, .mb = 0, .chunk = 1},
        {.op = LOCO_PP_BW, .peer = -1, .mb = 0, .chunk = 1},
        {.op = LOCO_PP_SEND, .msg = LOCO_PP_GRAD, .peer = 0, .mb = 0, .chunk = 1},
    };
    const loco_pp_action *lists[] = {r0, r1};
    const int lens[] = {4, 4}, place[] = {0, 1};
    loco_pp_schedule *s;
    cr_assert_eq(loco_pp_schedule_from_lists(&s, "cycle", 2, 1, 1, place, lists, lens), 0);
    loco_pp_sim r;
    cr_assert_eq(loco_pp_simulate(s, &unit, &r), LOCO_EINVAL);
    const char *msg = loco_errmsg();
    cr_assert(strstr(msg, "deadlock: rank 0 waits forever at action 2 (BW0.0) for the gradient of "
                          "(mb 0, chunk 1) from rank 1, whose SEND (rank 1's action 3) rank 1 "
                          "never reaches"),
              "%s", msg);
    cr_assert(strstr(msg, "rank 1 waits forever at action 1 (F0.1) for the activation of (mb 0, "
                          "chunk 0) from rank 0, whose SEND (rank 0's action 3) rank 0 never "
                          "reaches"),
              "%s", msg);
    loco_pp_schedule_destroy(s);
}

/* A rank waiting on itself: W listed before its B. */
Test(schedule, w_before_b_is_named) {
    const loco_pp_action r0[] = {
        {.op = LOCO_PP_F, .peer = -1, .mb = 0, .chunk = 0},
        {.op = LOCO_PP_SEND, .msg = LOCO_PP_ACT, .peer = 1, .mb = 0, .chunk = 0},
        {.op = LOCO_PP_RECV, .msg = LOCO_PP_GRAD, .peer = 1, .mb = 0, .chunk = 1},
        {.op = LOCO_PP_B, .peer = -1, .mb = 0, .chunk = 0},
        {.op = LOCO_PP_W, .peer = -1, .mb = 0, .chunk = 0},
    };
    const loco_pp_action r1[] = {
        {.op = LOCO_PP_RECV, .msg = LOCO_PP_ACT, .peer = 0, .mb = 0, .chunk = 0},
        {.op = LOCO_PP_F, .peer = -1, .mb = 0, .chunk = 1},
        {.op = LOCO_PP_W, .peer = -1, .mb = 0, .chunk = 1},
        {.op = LOCO_PP_B, .peer = -1, .mb = 0, .chunk = 1},
        {.op = LOCO_PP_SEND, .msg = LOCO_PP_GRAD, .peer = 0, .mb = 0, .chunk = 1},
    };
    const loco_pp_action *lists[] = {r0, r1};
    const int lens[] = {5, 5}, place[] = {0, 1};
    loco_pp_schedule *s;
    cr_assert_eq(loco_pp_schedule_from_lists(&s, "self", 2, 1, 1, place, lists, lens), 0);
    loco_pp_sim r;
    cr_assert_eq(loco_pp_simulate(s, &unit, &r), LOCO_EINVAL);
    cr_assert(strstr(loco_errmsg(), "rank 1 waits forever at action 2 (W0.1) for its B, its own "
                                    "action 3, later in its list"),
              "%s", loco_errmsg());
    loco_pp_schedule_destroy(s);
}

/* Misplaced or duplicated actions are refused before anything runs. */
Test(schedule, misplaced_actions) {
    const loco_pp_action wrong_rank[] = {{.op = LOCO_PP_F, .peer = -1, .mb = 0, .chunk = 1}};
    const loco_pp_action local_send[] = {
        {.op = LOCO_PP_SEND, .msg = LOCO_PP_ACT, .peer = 1, .mb = 0, .chunk = 0}};
    const loco_pp_action wrong_peer[] = {
        {.op = LOCO_PP_SEND, .msg = LOCO_PP_ACT, .peer = 0, .mb = 0, .chunk = 0}};
    const loco_pp_action twice[] = {{.op = LOCO_PP_F, .peer = -1, .mb = 0, .chunk = 0},
                                    {.op = LOCO_PP_F, .peer = -1, .mb = 0, .chunk = 0}};
    /* chunks 0, 1 on rank 0 for the local send; looped (c mod 2) for the rest */
    const int v_local[] = {0, 0, 1, 1}, looped[] = {0, 1, 0, 1};
    const struct {
        const loco_pp_action *a;
        int n;
        const int *place;
        const char *want;
    } cases[] = {
        {wrong_rank, 1, looped, "rank 0 action 0 (F0.1): chunk 1 lives on rank 1"},
        {local_send, 1, v_local, "chunks 0 and 1 are both on rank 0 and exchange nothing"},
        {wrong_peer, 1, looped,
         "(Sa0.0>0): the activation of chunk 0 goes from rank 0 to rank 1, so it is the "
         "sender's SEND with peer 1"},
        {twice, 2, looped, "two F of (mb 0, chunk 0): rank 0 action 0 and rank 0 action 1"},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        const loco_pp_action *lists[] = {cases[k].a, NULL};
        const int lens[] = {cases[k].n, 0};
        loco_pp_schedule *s;
        cr_assert_eq(loco_pp_schedule_from_lists(&s, "bad", 2, 2, 1, cases[k].place, lists, lens),
                     0);
        loco_pp_sim r;
        cr_assert_eq(loco_pp_simulate(s, &unit, &r), LOCO_EINVAL, "case %zu", k);
        cr_assert(strstr(loco_errmsg(), cases[k].want), "case %zu: %s", k, loco_errmsg());
        loco_pp_schedule_destroy(s);
    }
}

static void refused(const char *name, int p, int v, int m, const char *want) {
    loco_pp_schedule *s = NULL;
    cr_assert_eq(loco_pp_schedule_create(&s, name, p, v, m), LOCO_EINVAL, "%s p=%d v=%d m=%d",
                 name ? name : "NULL", p, v, m);
    cr_assert_null(s);
    cr_assert(strstr(loco_errmsg(), want), "%s p=%d v=%d m=%d: %s", name ? name : "NULL", p, v, m,
              loco_errmsg());
}

Test(schedule, bad_inputs) {
    refused("pipedream", 4, 1, 8,
            "unknown pipeline schedule 'pipedream' (valid: gpipe, 1f1b, interleaved, zb-h1, zbv, "
            "dualpipev)");
    refused(NULL, 4, 1, 8, "unknown pipeline schedule");
    refused("1f1b", 1, 1, 8, "needs p >= 2 ranks, got p = 1");
    refused("gpipe", 4, 2, 8, "runs one chunk per rank (v = 1), got v = 2");
    refused("interleaved", 4, 1, 8, "needs v >= 2 virtual stages per rank");
    refused("interleaved", 4, 2, 2, "needs m >= p and a multiple of p");
    refused("interleaved", 4, 2, 6, "needs m >= p and a multiple of p");
    refused("zbv", 4, 1, 8, "fixes v = 2 chunks per rank");
    refused("dualpipev", 4, 3, 8, "fixes v = 2 chunks per rank");
    refused("dualpipev", 4, 2, 7, "needs m >= 2p = 8 micro-batches");
    refused("1f1b", 4, 1, 0, "must be >= 1");
    refused("1f1b", 4096, 1, 8, "beyond the limits");
    const loco_pp_costs negative = {.f = 1, .b = -1, .w = 1};
    loco_pp_schedule *s = make("1f1b", 2, 1, 2);
    loco_pp_sim r;
    cr_assert_eq(loco_pp_simulate(s, &negative, &r), LOCO_EINVAL);
    loco_pp_schedule_destroy(s);
}

/* parallel.virtual_stages = 0 (its default) takes the schedule's own
 * chunks per rank; a value given stays checked against the schedule. */
Test(schedule, virtual_stages_default_follows_the_schedule) {
    static const struct {
        const char *name;
        int v;
    } own[] = {{"gpipe", 1}, {"1f1b", 1},       {"interleaved", 2},
               {"zb-h1", 1}, {"zbv", 2},        {"dualpipev", 2}};
    for (size_t i = 0; i < sizeof own / sizeof own[0]; i++) {
        loco_pp_schedule *s = make(own[i].name, 2, 0, 4);
        int p, v, m;
        loco_pp_schedule_shape(s, &p, &v, &m);
        cr_assert(p == 2 && v == own[i].v && m == 4, "%s: p=%d v=%d m=%d", own[i].name, p, v, m);
        loco_pp_schedule_destroy(s);
    }
    refused("zbv", 2, 1, 4, "fixes v = 2 chunks per rank");
    refused("dualpipev", 2, 3, 4, "fixes v = 2 chunks per rank");
    refused("interleaved", 2, 1, 4, "needs v >= 2");
    refused("1f1b", 2, 2, 4, "runs one chunk per rank");
}

Test(schedule, from_config) {
    loco_config cfg;
    loco_config_defaults(&cfg);
    cr_assert_str_eq(cfg.parallel.pp_schedule, "1f1b");
    cr_assert_eq(cfg.parallel.virtual_stages, 0, "0 = the schedule's own");
    cr_assert_eq(loco_config_set(&cfg, "parallel.pp=4"), 0);
    cr_assert_eq(loco_config_set(&cfg, "train.grad_accum=8"), 0);
    cr_assert_eq(loco_config_set(&cfg, "parallel.pp_schedule=zb-h1"), 0);
    loco_pp_schedule *s;
    cr_assert_eq(loco_pp_schedule_from_config(&s, &cfg), 0, "%s", loco_errmsg());
    int p, v, m;
    loco_pp_schedule_shape(s, &p, &v, &m);
    cr_assert(p == 4 && v == 1 && m == 8, "p=%d v=%d m=%d (microbatches 0 = grad_accum)", p, v, m);
    cr_assert_str_eq(loco_pp_schedule_name(s), "zb-h1");
    loco_pp_schedule_destroy(s);
    cr_assert_eq(loco_config_set(&cfg, "parallel.microbatches=6"), 0);
    cr_assert_eq(loco_config_set(&cfg, "parallel.pp_schedule=dualpipev"), 0);
    cr_assert_eq(loco_pp_schedule_from_config(&s, &cfg), LOCO_EINVAL);
    cr_assert(strstr(loco_errmsg(), "needs m >= 2p = 8"), "%s", loco_errmsg());
    cr_assert_eq(loco_config_set(&cfg, "parallel.pp=2"), 0);
    cr_assert_eq(loco_pp_schedule_from_config(&s, &cfg), 0, "%s", loco_errmsg());
    loco_pp_schedule_shape(s, &p, &v, &m);
    cr_assert(p == 2 && v == 2 && m == 6);
    loco_pp_schedule_destroy(s);
}

/* Every allocation of generating and simulating may fail: LOCO_ENOMEM, no
 * leak (ASan), and success once allocations are left alone. */
Test(schedule, allocation_failures) {
    for (int k = 0; k < N_NAMES; k++) {
        const int v = chunks_per_rank(names[k]);
        for (long n = 1;; n++) {
            loco_pp_schedule *s = NULL;
            loco_pp_sim r;
            loco_alloc_fail_after(n);
            int rc = loco_pp_schedule_create(&s, names[k], 4, v, 8);
            if (rc == 0) {
                rc = loco_pp_simulate(s, &unit, &r);
                if (rc == 0)
                    loco_pp_sim_fini(&r);
            }
            loco_alloc_fail_after(0);
            loco_pp_schedule_destroy(s);
            if (rc == 0)
                break;
            cr_assert_eq(rc, LOCO_ENOMEM, "%s, allocation %ld: %s", names[k], n, loco_errmsg());
        }
    }
}

Test(schedule, action_text) {
    char buf[48];
    const loco_pp_action f = {
        .op = LOCO_PP_F, .flags = LOCO_PP_PAIRED, .peer = -1, .mb = 3, .chunk = 7};
    const loco_pp_action send = {
        .op = LOCO_PP_SEND, .msg = LOCO_PP_ACT, .peer = 1, .mb = 3, .chunk = 0};
    const loco_pp_action recv = {
        .op = LOCO_PP_RECV, .msg = LOCO_PP_GRAD, .peer = 2, .mb = 4, .chunk = 2};
    cr_assert_str_eq(loco_pp_action_str(&f, buf, sizeof buf), "F3.7+");
    cr_assert_str_eq(loco_pp_action_str(&send, buf, sizeof buf), "Sa3.0>1");
    cr_assert_str_eq(loco_pp_action_str(&recv, buf, sizeof buf), "Rg4.2<2");
    cr_assert_str_eq(loco_pp_generator_name(0), "gpipe");
    cr_assert_null(loco_pp_generator_name(N_NAMES));
}

Test(schedule, cli_table_and_lists) {
    static char out[1 << 16];
    cr_assert_eq(test_run(out, sizeof out, LOCO " pipeline"), 0, "%s", out);
    cr_assert(strstr(out, "| 1f1b | 4 | 8 | 1 | 0.2727 | 0.2727 | 4 | 4 | 4 | |"), "%s", out);
    cr_assert(strstr(out, "| dualpipev | 8 | 4 | 2 | — | — | — | — | — | refused: "), "%s", out);
    cr_assert_eq(test_run(out, sizeof out,
                          LOCO " pipeline --set parallel.pp=2 --set parallel.microbatches=2"),
                 0, "%s", out);
    cr_assert(strstr(out, "rank 1 (chunks 1)"), "%s", out);
    cr_assert(strstr(out, "Ra0.0<0 F0.1"), "%s", out);
    cr_assert_eq(test_run(out, sizeof out,
                          LOCO " pipeline --set parallel.pp=4 --set parallel.pp_schedule=zbv"),
                 0, "virtual_stages' default follows the schedule: %s", out);
    cr_assert(strstr(out, "rank 0 (chunks 0 7)"), "%s", out);
    cr_assert_eq(test_run(out, sizeof out,
                          LOCO " pipeline --set parallel.pp=4 --set parallel.pp_schedule=zbv"
                               " --set parallel.virtual_stages=1"),
                 1, "%s", out);
    cr_assert(strstr(out, "fixes v = 2 chunks per rank"), "%s", out);
    cr_assert_eq(test_run(out, sizeof out, LOCO " pipeline --costs 1,x,1"), 2, "%s", out);
}
