/* kernels/cuda/moe.cu, the mixture-of-experts kernels, against their CPU
 * twins (kernels/cpu/moe.c): random router logits and hand-made ties
 * (equal logits in a row, equal rows across tokens, so both the top-k's and
 * the capacity's tie-breaking decide), capacities that drop and dropless
 * ones, top-1, top-2 and top-E. The integers (experts, slots, rows, counts)
 * and the pure copies and sums (gather, its backward, combine's dy) must be
 * the CPU's bits; the rest within 1e-5 relative. Every test skips, with the
 * reason, where there is no device or no CUDA build. */
#include <criterion/criterion.h>

#ifndef LOCO_HAVE_CUDA
Test(gpu_moe, skipped)
{
    cr_skip_test("built without the CUDA toolkit (no nvcc found by make): "
                 "kernels/cuda not compiled");
}
#else

#include "tests/gpu/gpu_test.h"

enum { SLAB = 64 << 20 };

/* A device copy of n floats or ints (at least one element's room). */
static void *up(gpu_env *e, const void *h, size_t bytes)
{
    return bytes ? dup_to_dev(e, h, bytes) : dalloc(e, 4);
}

typedef struct {
    int N, E, k, cap, C;
    bool ties;     /* logits from a few rows of small integers */
    bool in_place; /* route with probs == logits */
    bool biased;   /* DeepSeek-V3's routing bias chooses the top-k */
    uint64_t seed;
} moe_case;

/* Router logits (N,E): uniform, or (ties) each token one of four rows of
 * integers, rotated by the token's position modulo 3: whole rows equal,
 * two- and three-way ties inside rows, many tokens with the same
 * probabilities for an expert. */
static float *make_logits(const moe_case *c, uint64_t *s)
{
    const size_t n = (size_t)c->N * c->E;
    if (!c->ties)
        return rand_f(s, n, 4.0);
    static const float pat[4][3] = {{0, 0, 0}, {1, 1, 0}, {2, 0, 2}, {0, 2, 1}};
    float *x = malloc(n * sizeof *x);
    cr_assert_not_null(x);
    for (int t = 0; t < c->N; t++) {
        const int p = (int)(gpu_splitmix(s) % 4), rot = t % 3;
        for (int e = 0; e < c->E; e++)
            x[(size_t)t * c->E + e] = pat[p][(e + rot) % 3];
    }
    return x;
}

/* ------------------------------------------------------ route, plan, losses */

/* The routing the CPU made, shared by the dispatch checks. */
typedef struct {
    float *probs, *lse, *weight;
    int32_t *expert, *slot, *rows, *count, *routed;
    int n; /* packed rows */
} moe_routing;

static void routing_free(moe_routing *r)
{
    free(r->probs), free(r->lse), free(r->weight), free(r->expert), free(r->slot);
    free(r->rows), free(r->count), free(r->routed);
}

/* Route and plan on both twins; the GPU's plan starts from the CPU's
 * routing, so its integers must match however the probabilities round. */
static void check_route_plan(gpu_env *e, const moe_case *c, moe_routing *r, uint64_t *s)
{
    const int N = c->N, E = c->E, k = c->k;
    const size_t ne = (size_t)N * E, nk = (size_t)N * k;
    float *logits = make_logits(c, s);
    void *d_logits = up(e, logits, ne * 4);
    void *d_probs = c->in_place ? d_logits : dalloc(e, ne * 4 + 4);
    void *d_lse = dalloc(e, (size_t)N * 4 + 4), *d_w = dalloc(e, nk * 4 + 4);
    void *d_ex = dalloc(e, nk * 4 + 4);
    /* a bias of about a probability's size: it changes many choices */
    float *bias = c->biased ? rand_f(s, (size_t)E, 0.3) : NULL;
    void *d_bias = bias ? up(e, bias, (size_t)E * 4) : NULL;
    GPU_OK(loco_cuda_moe_route(d_probs, d_lse, d_ex, d_w, d_logits, d_bias, N, E, k, NULL));

    r->probs = c->in_place ? logits : fill_f(ne, NAN);
    r->lse = fill_f(N, NAN), r->weight = fill_f(nk, NAN), r->expert = fill_i(nk, -7);
    loco_moe_route(r->probs, r->lse, r->expert, r->weight, logits, bias, N, E, k);
    free(bias);
    float *gp = down_f(d_probs, ne), *glse = down_f(d_lse, N), *gw = down_f(d_w, nk);
    int32_t *gex = down_i(d_ex, nk);
    EXPECT_SAME_BITS("route expert", gex, r->expert, nk);
    EXPECT_NEAR("route probs", gp, r->probs, ne, TOL_F32);
    EXPECT_NEAR("route lse", glse, r->lse, (size_t)N, TOL_F32);
    EXPECT_NEAR("route weight", gw, r->weight, nk, TOL_F32);
    free(gp), free(glse), free(gw), free(gex);
    if (!c->in_place)
        free(logits);

    r->slot = fill_i(nk, -7), r->rows = fill_i(nk, -7);
    r->count = fill_i(E, -7), r->routed = fill_i(E, -7);
    void *scratch = malloc(nk * 12 + 1);
    cr_assert_not_null(scratch);
    r->n = loco_moe_plan(r->slot, r->rows, r->count, r->routed, r->expert, r->probs, N, E, k,
                         c->cap, scratch);
    free(scratch);
    void *d_ex_cpu = up(e, r->expert, nk * 4), *d_p_cpu = up(e, r->probs, ne * 4);
    void *d_slot = dalloc(e, nk * 4 + 4), *d_rows = dalloc(e, nk * 4 + 4);
    void *d_count = dalloc(e, (size_t)E * 4), *d_routed = dalloc(e, (size_t)E * 4);
    GPU_OK(loco_cuda_zero(d_slot, nk * 4, NULL)); /* no stale -1 to hide a missing write */
    void *d_scratch = dalloc(e, LOCO_CUDA_MOE_PLAN_SCRATCH(N, E, k));
    GPU_OK(loco_cuda_moe_plan(d_slot, d_rows, d_count, d_routed, d_ex_cpu, d_p_cpu, N, E, k,
                              c->cap, d_scratch, NULL));
    int32_t *gslot = down_i(d_slot, nk), *grows = down_i(d_rows, nk);
    int32_t *gcount = down_i(d_count, E), *grouted = down_i(d_routed, E);
    int32_t *gtotal = down_i(d_scratch, 1);
    cr_expect_eq(gtotal[0], r->n, "plan: %d packed rows, the CPU %d", gtotal[0], r->n);
    EXPECT_SAME_BITS("plan slot", gslot, r->slot, nk);
    EXPECT_SAME_BITS("plan rows", grows, r->rows, (size_t)r->n);
    EXPECT_SAME_BITS("plan count", gcount, r->count, (size_t)E);
    EXPECT_SAME_BITS("plan routed", grouted, r->routed, (size_t)E);
    free(gslot), free(grows), free(gcount), free(grouted), free(gtotal);

    /* the case exercises what it says: cap < N drops, cap = N keeps all */
    if (c->cap < N)
        cr_expect_lt(r->n, (int)nk, "cap %d drops nothing", c->cap);
    else
        cr_expect_eq(r->n, (int)nk, "dropless: %d of %zu kept", r->n, nk);

    double aux, z, *g2 = malloc(2 * sizeof *g2);
    cr_assert_not_null(g2);
    void *d_lz = dalloc(e, 2 * sizeof(double)), *d_lse_cpu = up(e, r->lse, (size_t)N * 4);
    void *d_routed_cpu = up(e, r->routed, (size_t)E * 4);
    GPU_OK(loco_cuda_moe_losses(d_lz, (double *)d_lz + 1, d_p_cpu, d_lse_cpu, d_routed_cpu, N, E,
                                k, NULL));
    loco_moe_losses(&aux, &z, r->probs, r->lse, r->routed, N, E, k);
    to_host(g2, d_lz, 2 * sizeof *g2);
    cr_expect_leq(fabs(g2[0] - aux), TOL_F32 * fabs(aux), "aux loss %.17g, CPU %.17g", g2[0],
                  aux);
    cr_expect_leq(fabs(g2[1] - z), TOL_F32 * fabs(z), "z loss %.17g, CPU %.17g", g2[1], z);
    free(g2);
}

/* ---------------------------------------------------- dispatch and combine */

/* gather, combine and their backwards over the CPU's plan on random
 * activations and gradients; route_bwd on random dweight. */
static void check_dispatch(gpu_env *e, const moe_case *c, const moe_routing *r, uint64_t *s)
{
    const int N = c->N, E = c->E, k = c->k, C = c->C, n = r->n;
    const size_t nc = (size_t)N * C, rc = (size_t)n * C, nk = (size_t)N * k;
    const size_t ne = (size_t)N * E;
    float *x = rand_f(s, nc, 1.0), *y = rand_f(s, rc, 1.0), *dout = rand_f(s, nc, 1.0);
    float *dx = rand_f(s, nc, 0.5), *dxe = rand_f(s, rc, 1.0), *dwt = rand_f(s, nk, 1.0);
    void *d_x = up(e, x, nc * 4), *d_y = up(e, y, rc * 4), *d_dout = up(e, dout, nc * 4);
    void *d_dx = up(e, dx, nc * 4), *d_dxe = up(e, dxe, rc * 4), *d_dwt = up(e, dwt, nk * 4);
    void *d_slot = up(e, r->slot, nk * 4), *d_rows = up(e, r->rows, (size_t)n * 4);
    void *d_w = up(e, r->weight, nk * 4), *d_p = up(e, r->probs, ne * 4);
    void *d_lse = up(e, r->lse, (size_t)N * 4), *d_ex = up(e, r->expert, nk * 4);
    void *d_routed = up(e, r->routed, (size_t)E * 4);
    void *d_xe = dalloc(e, rc * 4 + 4), *d_out = dalloc(e, nc * 4 + 4);
    void *d_dy = dalloc(e, rc * 4 + 4), *d_dw = dalloc(e, nk * 4 + 4);
    void *d_dl = dalloc(e, ne * 4 + 4);

    float *xe = fill_f(rc, NAN), *out = fill_f(nc, NAN), *dy = fill_f(rc, NAN);
    float *dw = fill_f(nk, NAN), *dl = fill_f(ne, NAN);
    GPU_OK(loco_cuda_moe_gather(d_xe, d_x, d_rows, n, C, NULL));
    loco_moe_gather(xe, x, r->rows, n, C);
    GPU_OK(loco_cuda_moe_combine(d_out, d_y, d_slot, d_w, N, k, C, NULL));
    loco_moe_combine(out, y, r->slot, r->weight, N, k, C);
    GPU_OK(loco_cuda_moe_combine_bwd(d_dy, d_dw, d_dout, d_y, d_slot, d_w, N, k, C, NULL));
    loco_moe_combine_bwd(dy, dw, dout, y, r->slot, r->weight, N, k, C);
    for (int i = 0; i < 2; i++) { /* gradients accumulate */
        GPU_OK(loco_cuda_moe_gather_bwd(d_dx, d_dxe, d_slot, N, k, C, NULL));
        loco_moe_gather_bwd(dx, dxe, r->slot, N, k, C);
    }
    const float aux = 0.01f, zl = 0.001f, scale = 0.7f;
    GPU_OK(loco_cuda_moe_route_bwd(d_dl, d_dwt, d_p, d_lse, d_ex, d_w, d_routed, N, E, k, aux, zl,
                                   scale, NULL));
    loco_moe_route_bwd(dl, dwt, r->probs, r->lse, r->expert, r->weight, r->routed, N, E, k, aux,
                       zl, scale);

    float *gxe = down_f(d_xe, rc), *gout = down_f(d_out, nc), *gdy = down_f(d_dy, rc);
    float *gdw = down_f(d_dw, nk), *gdx = down_f(d_dx, nc), *gdl = down_f(d_dl, ne);
    EXPECT_SAME_BITS("gather", gxe, xe, rc);
    EXPECT_NEAR("combine", gout, out, nc, TOL_F32);
    EXPECT_SAME_BITS("combine_bwd dy", gdy, dy, rc);
    EXPECT_NEAR("combine_bwd dweight", gdw, dw, nk, TOL_F32);
    for (size_t i = 0; i < nk; i++)
        if (r->slot[i] < 0)
            cr_expect(gdw[i] == 0.0f, "dropped assignment %zu: dweight %g, not 0", i,
                      (double)gdw[i]);
    EXPECT_SAME_BITS("gather_bwd", gdx, dx, nc);
    EXPECT_NEAR("route_bwd", gdl, dl, ne, TOL_F32);
    free(gxe), free(gout), free(gdy), free(gdw), free(gdx), free(gdl);
    free(x), free(y), free(dout), free(dx), free(dxe), free(dwt);
    free(xe), free(out), free(dy), free(dw), free(dl);
}

static void check_moe(moe_case c)
{
    gpu_env e;
    gpu_env_init(&e, SLAB);
    uint64_t s = c.seed;
    moe_routing r;
    check_route_plan(&e, &c, &r, &s);
    check_dispatch(&e, &c, &r, &s);
    routing_free(&r);
    gpu_env_fini(&e);
}

Test(gpu_moe, random_top2_drops)
{
    check_moe((moe_case){.N = 37, .E = 5, .k = 2, .cap = 9, .C = 19, .seed = 301});
}
Test(gpu_moe, random_top2_dropless)
{
    check_moe((moe_case){.N = 37, .E = 5, .k = 2, .cap = 37, .C = 19, .seed = 302});
}
Test(gpu_moe, random_top1_drops)
{
    check_moe((moe_case){.N = 37, .E = 8, .k = 1, .cap = 3, .C = 19, .seed = 303});
}
Test(gpu_moe, random_top1_dropless)
{
    check_moe((moe_case){.N = 37, .E = 8, .k = 1, .cap = 37, .C = 19, .seed = 304});
}
Test(gpu_moe, random_top_all_drops)
{
    check_moe((moe_case){.N = 37, .E = 5, .k = 5, .cap = 20, .C = 19, .seed = 305});
}
Test(gpu_moe, random_top_all_dropless)
{
    check_moe((moe_case){.N = 37, .E = 5, .k = 5, .cap = 37, .C = 19, .seed = 306});
}
Test(gpu_moe, random_top2_biased_drops)
{
    check_moe((moe_case){.N = 37, .E = 5, .k = 2, .cap = 9, .C = 19, .biased = true, .seed = 312});
}
Test(gpu_moe, ties_top2_drops)
{
    check_moe((moe_case){.N = 37, .E = 5, .k = 2, .cap = 6, .C = 19, .ties = true, .seed = 307});
}
Test(gpu_moe, ties_top2_dropless)
{
    check_moe((moe_case){.N = 37, .E = 5, .k = 2, .cap = 37, .C = 19, .ties = true, .seed = 308});
}
Test(gpu_moe, ties_top1_drops_in_place)
{
    check_moe((moe_case){
        .N = 37, .E = 8, .k = 1, .cap = 4, .C = 19, .ties = true, .in_place = true, .seed = 309});
}
/* More assignments than a block's threads: the plan's scans carry over
 * chunks (experts with over 256 routed). */
Test(gpu_moe, many_tokens_drops)
{
    check_moe((moe_case){.N = 600, .E = 4, .k = 2, .cap = 270, .C = 70, .seed = 310});
}
Test(gpu_moe, many_tokens_ties_drops)
{
    check_moe((moe_case){.N = 600, .E = 4, .k = 2, .cap = 270, .C = 40, .ties = true,
                         .seed = 311});
}

Test(gpu_moe, bad_shapes_refused)
{
    gpu_require();
    cr_expect_eq(loco_cuda_moe_route(NULL, NULL, NULL, NULL, NULL, NULL, 4, 3, 4, NULL),
                 LOCO_EINVAL);
    cr_expect_eq(loco_cuda_moe_route(NULL, NULL, NULL, NULL, NULL, NULL, 4, 3, 0, NULL),
                 LOCO_EINVAL);
    cr_expect_eq(loco_cuda_moe_plan(NULL, NULL, NULL, NULL, NULL, NULL, 4, 3, 2, -1, NULL, NULL),
                 LOCO_EINVAL);
    cr_expect_eq(loco_cuda_moe_route_bwd(NULL, NULL, NULL, NULL, NULL, NULL, NULL, 4, 2, 3, 0.0f,
                                         0.0f, 1.0f, NULL),
                 LOCO_EINVAL);
}

#endif /* LOCO_HAVE_CUDA */
