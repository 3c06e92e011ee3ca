/* The trainer's pipeline stage: plans the chunks from the schedule, then
 * drives the model's chunk passes through the one executor: the CPU
 * model's, or under train.device = cuda the device model's (its
 * data-parallel reductions then run after the schedule, train_device.c). */
#include "inner/train/internal.h"

#if defined(LOCO_HAVE_CUDA)
#include "kernels/kernels.h"
#endif

#include <stdlib.h>
#include <string.h>

struct loco__pp {
    loco_pp_schedule *sched;
    int p, v, m, n_chunks, rank;
    loco_gpt_stage *stages; /* (p) every rank's */
    int *local;             /* (n_chunks) global chunk -> index in this stage, -1 */
    int *first_block;       /* (n_chunks + 1) chunk c is blocks [first[c], first[c + 1]) */
    loco_gpt *model;        /* not owned */
    loco_comm *pp;          /* the mesh's pp group (not owned) */
    loco_comm *tied;        /* the embedding and head ranks, when they differ */
    int tied_root;          /* rank of the embedding stage in `tied` */
    const loco_tensor *wte; /* this stage's wte (embedding or head), or NULL */
    int wte_chunks_left;    /* this step's chunks still writing wte's gradient */
    loco_zero *zero;        /* dp over the stage (not owned) */
    size_t *chunk_lo, *chunk_hi; /* (stage chunks) flat range of each */
    int *fwd_done, *w_done; /* (stage chunks) passes this step */
    loco_pp_exec *exec;
    int B, T;
    int *slot_of;   /* (m * n_chunks) slot of a (mb, chunk) in flight, -1 */
    bool *busy;     /* (slots) */
    const int32_t *inputs, *targets; /* of the step (m x B x T) */
    double loss_sum;
    float scale;    /* of each micro-batch's loss */
    bool split_w;   /* this rank's list runs W apart from B */
#if defined(LOCO_HAVE_CUDA)
    loco_gpt_cuda *dev; /* the device model that runs the passes, or NULL */
#endif
};

/* The chunk passes on the device model when there is one, else on the
 * CPU model (the CPU passes' inputs are the same either way). */
#if defined(LOCO_HAVE_CUDA)
#define ON_DEVICE(pp) ((pp)->dev != NULL)
#else
#define ON_DEVICE(pp) false
#endif

void loco__pp_destroy(loco__pp *pp) {
    if (!pp)
        return;
    loco_pp_exec_destroy(pp->exec);
    loco_pp_schedule_destroy(pp->sched);
    loco_comm_destroy(pp->tied);
    loco_free(pp->stages);
    loco_free(pp->local);
    loco_free(pp->first_block);
    loco_free(pp->slot_of);
    loco_free(pp->busy);
    loco_free(pp->chunk_lo);
    loco_free(pp->chunk_hi);
    loco_free(pp->fwd_done);
    loco_free(pp->w_done);
    loco_free(pp);
}

const loco_gpt_stage *loco__pp_stages(const loco__pp *pp) { return pp->stages; }
bool loco__pp_split_w(const loco__pp *pp) { return pp->split_w; }

#if defined(LOCO_HAVE_CUDA)
void loco__pp_set_device(loco__pp *pp, loco_gpt_cuda *dev) { pp->dev = dev; }

/* The device's wte gradient [off, off + n) summed with the other stage's
 * copy over `tied`, staged through the CPU model's gradient buffer. */
static int device_tied_sum(loco__pp *pp, size_t off, size_t n) {
    float *grads, *host = loco_gpt_grads(pp->model) + off;
    loco_gpt_cuda_state(pp->dev, NULL, &grads, NULL, NULL, NULL);
    loco_stream s = loco_cuda_compute_stream();
    LOCO_CHECK(loco_cuda_copy(host, grads + off, n * sizeof(float), s));
    LOCO_CHECK(loco_cuda_sync(s));
    LOCO_CHECK(loco_comm_allreduce(pp->tied, host, n, LOCO_DT_F32, LOCO_OP_SUM));
    LOCO_CHECK(loco_cuda_copy(grads + off, host, n * sizeof(float), s));
    return loco_cuda_sync(s);
}
#endif

/* The blocks of every chunk: parallel.pp_layers' counts, or equal ones.
 * first[c] is chunk c's first block; first[n] = model.n_layer. */
static int chunk_blocks(const loco_config *cfg, int n, int *first) {
    const int L = (int)cfg->model.n_layer;
    const char *list = cfg->parallel.pp_layers;
    if (!list[0]) {
        if (L % n || n > L)
            return LOCO_ERR(LOCO_EINVAL,
                            "model.n_layer = %d does not split into parallel.pp x "
                            "virtual_stages = %d chunks of equal blocks (parallel.pp_layers "
                            "may list uneven ones)",
                            L, n);
        for (int c = 0; c <= n; c++)
            first[c] = c * (L / n);
        return 0;
    }
    const char *at = list;
    int c = 0, sum = 0;
    first[0] = 0;
    while (*at) {
        char *end;
        const long k = strtol(at, &end, 10);
        if (end == at || k < 1 || k > L || (*end && *end != ','))
            return LOCO_ERR(LOCO_EINVAL,
                            "parallel.pp_layers = \"%s\": entry %d is not a block count >= 1 "
                            "(expected comma-separated counts, e.g. 3,5)",
                            list, c + 1);
        if (c == n)
            return LOCO_ERR(LOCO_EINVAL,
                            "parallel.pp_layers = \"%s\" lists more than parallel.pp x "
                            "virtual_stages = %d chunks",
                            list, n);
        sum += (int)k;
        first[++c] = sum;
        at = *end ? end + 1 : end;
    }
    if (c != n || sum != L)
        return LOCO_ERR(LOCO_EINVAL,
                        "parallel.pp_layers = \"%s\": %d chunks of %d blocks in all, but "
                        "parallel.pp x virtual_stages = %d chunks of model.n_layer = %d blocks",
                        list, c, sum, n, L);
    return 0;
}

int loco__pp_plan(loco__pp **out, const loco_config *cfg, const loco_mesh *mesh, int m,
                  loco_gpt_stage *stage) {
    *out = NULL;
    loco__pp *pp = loco_alloc(sizeof *pp);
    if (!pp)
        return LOCO_ERR(LOCO_ENOMEM, "pipeline state");
    int rc;
    pp->p = mesh->size[LOCO_DIM_PP];
    pp->rank = mesh->coord[LOCO_DIM_PP];
    pp->v = (int)cfg->parallel.virtual_stages;
    pp->m = m;
    LOCO_CHECK_GOTO(loco_pp_schedule_create(&pp->sched, cfg->parallel.pp_schedule, pp->p, pp->v,
                                            m),
                    out_fail);
    int p_, m_;
    loco_pp_schedule_shape(pp->sched, &p_, &pp->v, &m_);
    pp->n_chunks = pp->p * pp->v;
    if (pp->v > LOCO_GPT_MAX_CHUNKS) {
        rc = LOCO_ERR(LOCO_EINVAL, "parallel.virtual_stages = %d: at most %d chunks per rank",
                      pp->v, LOCO_GPT_MAX_CHUNKS);
        goto out_fail;
    }
    pp->first_block = loco_alloc(((size_t)pp->n_chunks + 1) * sizeof(int));
    if (!pp->first_block) {
        rc = LOCO_ERR(LOCO_ENOMEM, "pipeline chunks");
        goto out_fail;
    }
    LOCO_CHECK_GOTO(chunk_blocks(cfg, pp->n_chunks, pp->first_block), out_fail);
    pp->stages = loco_alloc((size_t)pp->p * sizeof *pp->stages);
    pp->local = loco_alloc((size_t)pp->n_chunks * sizeof(int));
    pp->slot_of = loco_alloc((size_t)m * pp->n_chunks * sizeof(int));
    if (!pp->stages || !pp->local || !pp->slot_of) {
        rc = LOCO_ERR(LOCO_ENOMEM, "pipeline tables");
        goto out_fail;
    }
    /* The simulator's peak of live (mb, chunk) activations per rank is the
     * number of slots that rank needs. */
    loco_pp_sim sim = {0};
    const loco_pp_costs costs = {.f = 1, .b = 1, .w = 1};
    LOCO_CHECK_GOTO(loco_pp_simulate(pp->sched, &costs, &sim), out_fail);
    for (int r = 0; r < pp->p; r++) {
        loco_gpt_stage *st = &pp->stages[r];
        memset(st, 0, sizeof *st);
        st->slots = sim.ranks[r].peak_live > 0 ? sim.ranks[r].peak_live : 1;
        for (int c = 0; c < pp->n_chunks; c++) /* model order */
            if (loco_pp_chunk_rank(pp->sched, c) == r) {
                if (r == pp->rank)
                    pp->local[c] = st->n;
                st->first[st->n] = pp->first_block[c];
                st->end[st->n] = pp->first_block[c + 1];
                st->n++;
            } else if (r == pp->rank) {
                pp->local[c] = -1;
            }
    }
    loco_pp_sim_fini(&sim);
    int n_actions;
    const loco_pp_action *acts = loco_pp_rank_actions(pp->sched, pp->rank, &n_actions);
    for (int i = 0; i < n_actions; i++)
        pp->split_w |= acts[i].op == LOCO_PP_W;
    *stage = pp->stages[pp->rank];
    pp->busy = loco_alloc((size_t)stage->slots * sizeof(bool));
    if (!pp->busy) {
        rc = LOCO_ERR(LOCO_ENOMEM, "pipeline slots");
        goto out_fail;
    }
    *out = pp;
    return 0;
out_fail:
    loco__pp_destroy(pp);
    return rc;
}

/* A chunk's flat range: its blocks, with the embeddings before the first
 * and ln_f (and a head stage's wte) after the last. */
static void chunk_range(const loco_gpt *m, int chunk, size_t *lo, size_t *hi) {
    const loco_gpt_stage *st = loco_gpt_stage_of(m);
    const int L = loco_gpt_cfg(m)->n_layer, first = st->first[chunk], end = st->end[chunk];
    size_t unused;
    loco_gpt_unit_range(m, first == 0 ? 0 : first + 1, lo, &unused);
    loco_gpt_unit_range(m, end == L ? L + 1 : end, &unused, hi);
}

/* Chunks of the stage whose passes write wte's gradient: the embedding's
 * and the tied head's (an untied head writes lm_head's). */
static int wte_writers(const loco_gpt *m) {
    const loco_gpt_stage *st = loco_gpt_stage_of(m);
    const loco_gpt_config *cfg = loco_gpt_cfg(m);
    return (st->first[0] == 0) + (!cfg->untied && st->end[st->n - 1] == cfg->n_layer);
}

int loco__pp_bind(loco__pp *pp, loco_gpt *model, const loco_mesh *mesh, int B, int T,
                  loco_zero *zero) {
    pp->model = model;
    pp->zero = zero;
    const int n = loco_gpt_stage_of(model)->n;
    pp->chunk_lo = loco_alloc((size_t)n * sizeof(size_t));
    pp->chunk_hi = loco_alloc((size_t)n * sizeof(size_t));
    pp->fwd_done = loco_alloc((size_t)n * sizeof(int));
    pp->w_done = loco_alloc((size_t)n * sizeof(int));
    if (!pp->chunk_lo || !pp->chunk_hi || !pp->fwd_done || !pp->w_done)
        return LOCO_ERR(LOCO_ENOMEM, "pipeline chunk tables");
    for (int c = 0; c < n; c++)
        chunk_range(model, c, &pp->chunk_lo[c], &pp->chunk_hi[c]);
    pp->pp = mesh->group[LOCO_DIM_PP];
    pp->B = B, pp->T = T;
    const loco_gpt_config *mc = loco_gpt_cfg(model);
    const int t = mc->tp;
    /* A micro-batch's rows on this rank: the model's T is the local rows under cp. */
    int cap_B, cap_T;
    loco_gpt_capacity(model, &cap_B, &cap_T);
    const size_t rows = (size_t)B * cap_T / (loco_gpt_parallel_of(model)->sp ? (size_t)t : 1);
    LOCO_CHECK(loco_pp_exec_create(&pp->exec, pp->sched, pp->pp, rows * (size_t)mc->n_embd));
    /* The stage with the embeddings and the one with the head, when they
     * are two ranks, sum their wte gradients and share its values. */
    const int first = loco_pp_chunk_rank(pp->sched, 0);
    const int last = loco_pp_chunk_rank(pp->sched, pp->n_chunks - 1);
    if (first != last && !mc->untied) {
        const bool member = pp->rank == first || pp->rank == last;
        LOCO_CHECK(loco_comm_split(pp->pp, member ? 0 : LOCO_COMM_COLOR_NONE,
                                   pp->rank == first ? 0 : 1, &pp->tied));
        pp->tied_root = 0;
    }
    const loco_ttable *tt = loco_gpt_table(model);
    const int wte = loco_ttable_find(tt, "transformer.wte.weight");
    pp->wte = wte >= 0 ? &tt->t[wte] : NULL;
    return 0;
}

/* ------------------------------------------------------------ callbacks */

/* The chunk's last backward ended: its gradients are final and their dp
 * reduction starts while the pipeline drains. The tied wte (first in the
 * embedding's chunk, last in a head stage's) waits for every chunk that
 * writes it, and for its sum with the other stage's copy (after the
 * schedule) when the embeddings and the head are on two stages. */
static int chunk_grads_ready(loco__pp *pp, int lc) {
    size_t lo = pp->chunk_lo[lc], hi = pp->chunk_hi[lc];
    const loco_gpt *m = pp->model;
    if (pp->wte) {
        const size_t a = pp->wte->offset, b = a + pp->wte->numel;
        if (a == lo && b <= hi)
            lo = b;
        else if (b == hi && a >= lo)
            hi = a;
    }
    LOCO_CHECK(loco_zero_grads_ready(pp->zero, lo, hi));
    const loco_gpt_stage *st = loco_gpt_stage_of(m);
    const bool writes_wte = st->first[lc] == 0 || st->end[lc] == loco_gpt_cfg(m)->n_layer;
    if (pp->wte && writes_wte && --pp->wte_chunks_left == 0 && !pp->tied)
        return loco_zero_grads_ready(pp->zero, pp->wte->offset, pp->wte->offset + pp->wte->numel);
    return 0;
}

static int slot_take(loco__pp *pp, int mb, int chunk) {
    const int slots = loco_gpt_stage_of(pp->model)->slots;
    for (int k = 0; k < slots; k++)
        if (!pp->busy[k]) {
            pp->busy[k] = true;
            pp->slot_of[mb * pp->n_chunks + chunk] = k;
            return k;
        }
    return LOCO_ERR(LOCO_EINVAL, "pipeline: no free activation slot of %d for (%d, %d)", slots, mb,
                    chunk);
}

static int slot_in_use(const loco__pp *pp, int mb, int chunk) {
    const int k = pp->slot_of[mb * pp->n_chunks + chunk];
    return k >= 0 ? k : LOCO_ERR(LOCO_EINVAL, "pipeline: (%d, %d) has no activations", mb, chunk);
}

static const int32_t *tokens(const loco__pp *pp, const int32_t *all, int mb) {
    return all + (size_t)mb * pp->B * pp->T;
}

static int on_forward(void *ctx, int mb, int chunk, const float *in, float *out) {
    loco__pp *pp = ctx;
    const int lc = pp->local[chunk];
    if (pp->fwd_done[lc]++ == 0 && !ON_DEVICE(pp)) /* ZeRO-3: the chunk's gathered parameters */
        LOCO_CHECK(loco_zero_params_wait(pp->zero, pp->chunk_lo[lc], pp->chunk_hi[lc]));
    const int slot = slot_take(pp, mb, chunk);
    LOCO_CHECK(slot);
    float loss = 0;
    const int32_t *inputs = tokens(pp, pp->inputs, mb), *targets = tokens(pp, pp->targets, mb);
#if defined(LOCO_HAVE_CUDA)
    if (pp->dev)
        LOCO_CHECK(loco_gpt_cuda_chunk_forward(pp->dev, slot, lc, inputs, targets, pp->B, pp->T,
                                               in, out, pp->scale, &loss));
    else
#endif
        LOCO_CHECK(loco_gpt_chunk_forward(pp->model, slot, lc, inputs, targets, pp->B, pp->T, in,
                                          out, pp->scale, &loss));
    if (chunk == pp->n_chunks - 1)
        pp->loss_sum += loss;
    return 0;
}

static int on_backward_input(void *ctx, int mb, int chunk, const float *dout, float *din) {
    loco__pp *pp = ctx;
    const int slot = slot_in_use(pp, mb, chunk);
    LOCO_CHECK(slot);
#if defined(LOCO_HAVE_CUDA)
    if (pp->dev)
        return loco_gpt_cuda_chunk_backward_input(pp->dev, slot, pp->local[chunk], pp->B, pp->T,
                                                  dout, din);
#endif
    return loco_gpt_chunk_backward_input(pp->model, slot, pp->local[chunk],
                                         tokens(pp, pp->inputs, mb), pp->B, pp->T, dout, din);
}

static int on_backward_weight(void *ctx, int mb, int chunk) {
    loco__pp *pp = ctx;
    const int slot = slot_in_use(pp, mb, chunk);
    LOCO_CHECK(slot);
#if defined(LOCO_HAVE_CUDA)
    if (pp->dev)
        LOCO_CHECK(loco_gpt_cuda_chunk_backward_weight(pp->dev, slot, pp->local[chunk], pp->B,
                                                       pp->T));
    else
#endif
        LOCO_CHECK(
            loco_gpt_chunk_backward_weight(pp->model, slot, pp->local[chunk], pp->B, pp->T));
    pp->busy[slot] = false;
    pp->slot_of[mb * pp->n_chunks + chunk] = -1;
    const int lc = pp->local[chunk];
    if (++pp->w_done[lc] == pp->m && !ON_DEVICE(pp))
        LOCO_CHECK(chunk_grads_ready(pp, lc));
    return 0;
}

/* --------------------------------------------------------------- steps */

int loco__pp_step(loco__pp *pp, const int32_t *inputs, const int32_t *targets, double *loss) {
    pp->inputs = inputs, pp->targets = targets;
    pp->loss_sum = 0;
    pp->scale = 1.0f / (float)pp->m;
    for (int i = 0; i < pp->m * pp->n_chunks; i++)
        pp->slot_of[i] = -1;
    const loco_gpt_stage *st = loco_gpt_stage_of(pp->model);
    memset(pp->busy, 0, (size_t)st->slots * sizeof(bool));
    const int n = st->n;
    memset(pp->fwd_done, 0, (size_t)n * sizeof(int));
    memset(pp->w_done, 0, (size_t)n * sizeof(int));
    pp->wte_chunks_left = wte_writers(pp->model);
    for (int c = 0; c < n && !ON_DEVICE(pp); c++) /* ZeRO-3: every chunk's gather starts now */
        LOCO_CHECK(loco_zero_params_prefetch(pp->zero, pp->chunk_lo[c], pp->chunk_hi[c]));
    const loco_pp_stage_ops ops = {.ctx = pp, .forward = on_forward,
                                   .backward_input = on_backward_input,
                                   .backward_weight = on_backward_weight};
    LOCO_CHECK(loco_pp_execute(pp->exec, &ops, NULL));
#if defined(LOCO_HAVE_CUDA)
    if (pp->tied && pp->dev) /* the device's copies; its dp reduction follows */
        LOCO_CHECK(device_tied_sum(pp, pp->wte->offset, pp->wte->numel));
    else
#endif
    if (pp->tied) {
        LOCO_CHECK(loco_comm_allreduce(pp->tied, loco_gpt_grads(pp->model) + pp->wte->offset,
                                       pp->wte->numel, LOCO_DT_F32, LOCO_OP_SUM));
        LOCO_CHECK(loco_zero_grads_ready(pp->zero, pp->wte->offset,
                                         pp->wte->offset + pp->wte->numel));
    }
    /* The loss is the last stage's; every stage reports it. */
    double sum = pp->loss_sum;
    LOCO_CHECK(loco_comm_allreduce(pp->pp, &sum, 1, LOCO_DT_F64, LOCO_OP_SUM));
    *loss = sum / pp->m;
    return 0;
}

int loco__pp_eval(loco__pp *pp, const int32_t *inputs, const int32_t *targets, double *loss) {
    /* The chunks in model order, each rank passing its output on with a
     * blocking send: evaluation needs no overlap. */
    loco_gpt *m = pp->model;
    if (!ON_DEVICE(pp))
        LOCO_CHECK(loco_zero_gather_params(pp->zero));
    const loco_gpt_config *mc = loco_gpt_cfg(m);
    int cap_B, cap_T;
    loco_gpt_capacity(m, &cap_B, &cap_T);
    const size_t n = (size_t)pp->B * cap_T / (loco_gpt_parallel_of(m)->sp ? (size_t)mc->tp : 1) *
                     mc->n_embd;
    float *buf = loco_alloc(2 * n * sizeof(float));
    if (!buf)
        return LOCO_ERR(LOCO_ENOMEM, "pipeline evaluation buffers");
    float *in = buf, *out = buf + n;
    float l = 0;
    int rc = 0;
    for (int c = 0; c < pp->n_chunks && rc == 0; c++) {
        const int owner = loco_pp_chunk_rank(pp->sched, c);
        if (owner != pp->rank)
            continue;
        const int prev = c > 0 ? loco_pp_chunk_rank(pp->sched, c - 1) : owner;
        if (prev != owner)
            rc = loco_comm_recv(pp->pp, in, n, LOCO_DT_F32, prev, c % LOCO_COMM_TAG_MAX);
#if defined(LOCO_HAVE_CUDA)
        if (rc == 0 && pp->dev)
            rc = loco_gpt_cuda_chunk_forward(pp->dev, 0, pp->local[c], inputs, targets, pp->B,
                                             pp->T, in, out, 1.0f, &l);
        else
#endif
        if (rc == 0)
            rc = loco_gpt_chunk_forward(m, 0, pp->local[c], inputs, targets, pp->B, pp->T, in, out,
                                        1.0f, &l);
        if (rc == 0 && c + 1 < pp->n_chunks) {
            const int next = loco_pp_chunk_rank(pp->sched, c + 1);
            if (next != owner)
                rc = loco_comm_send(pp->pp, out, n, LOCO_DT_F32, next, (c + 1) % LOCO_COMM_TAG_MAX);
            else
                memcpy(in, out, n * sizeof(float));
        }
    }
    loco_free(buf);
    LOCO_CHECK(rc);
    double sum = loco_pp_chunk_rank(pp->sched, pp->n_chunks - 1) == pp->rank ? l : 0;
    LOCO_CHECK(loco_comm_allreduce(pp->pp, &sum, 1, LOCO_DT_F64, LOCO_OP_SUM));
    *loss = sum;
    return 0;
}

int loco__pp_sync_tied(loco__pp *pp) {
    if (!pp->tied)
        return 0;
    /* ZeRO-3 holds shards: the copy is made on the gathered buffer and
     * each rank takes its part back. */
    LOCO_CHECK(loco_zero_gather_params(pp->zero));
    LOCO_CHECK(loco_comm_broadcast(pp->tied, loco_gpt_params(pp->model) + pp->wte->offset,
                                   pp->wte->numel, LOCO_DT_F32, pp->tied_root));
    loco_zero_adopt_params(pp->zero);
    return 0;
}
