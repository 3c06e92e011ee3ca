/* The trainer's pipeline stage: plans the chunks from the schedule, then
 * drives the model's chunk passes through the one executor. */
#include "inner/train_pp.h"

#include <string.h>

struct loco__pp {
    loco_pp_schedule *sched;
    int p, v, m, n_chunks, rank;
    loco_gpt_stage *stages; /* (p) every rank's */
    int *local;             /* (n_chunks) global chunk -> index in this stage, -1 */
    loco_gpt *model;        /* not owned */
    loco_comm *pp;          /* the mesh's pp group (not owned) */
    loco_comm *tied;        /* the embedding and head ranks, when they differ */
    int tied_root;          /* rank of the embedding stage in `tied` */
    const loco_tensor *wte; /* this stage's wte, when it is in `tied` */
    loco_pp_exec *exec;
    int B, T;
    int *slot_of;   /* (m * n_chunks) slot of a (mb, chunk) in flight, -1 */
    bool *busy;     /* (slots) */
    const int32_t *inputs, *targets; /* of the step (m x B x T) */
    double loss_sum;
    float scale;    /* of each micro-batch's loss */
};

void loco__pp_destroy(loco__pp *pp) {
    if (!pp)
        return;
    loco_pp_exec_destroy(pp->exec);
    loco_pp_schedule_destroy(pp->sched);
    loco_comm_destroy(pp->tied);
    loco_free(pp->stages);
    loco_free(pp->local);
    loco_free(pp->slot_of);
    loco_free(pp->busy);
    loco_free(pp);
}

const loco_gpt_stage *loco__pp_stages(const loco__pp *pp) { return pp->stages; }

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
    const int L = (int)cfg->model.n_layer;
    if (L % pp->n_chunks || pp->n_chunks > L) {
        rc = LOCO_ERR(LOCO_EINVAL,
                      "model.n_layer = %d does not split into parallel.pp x virtual_stages = %d "
                      "chunks of equal blocks",
                      L, pp->n_chunks);
        goto out_fail;
    }
    if (pp->v > LOCO_GPT_MAX_CHUNKS) {
        rc = LOCO_ERR(LOCO_EINVAL, "parallel.virtual_stages = %d: at most %d chunks per rank",
                      pp->v, LOCO_GPT_MAX_CHUNKS);
        goto out_fail;
    }
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
    const int per = L / pp->n_chunks;
    for (int r = 0; r < pp->p; r++) {
        loco_gpt_stage *st = &pp->stages[r];
        memset(st, 0, sizeof *st);
        st->slots = sim.ranks[r].peak_live > 0 ? sim.ranks[r].peak_live : 1;
        for (int c = 0; c < pp->n_chunks; c++) /* model order */
            if (loco_pp_chunk_rank(pp->sched, c) == r) {
                if (r == pp->rank)
                    pp->local[c] = st->n;
                st->first[st->n] = c * per;
                st->end[st->n] = (c + 1) * per;
                st->n++;
            } else if (r == pp->rank) {
                pp->local[c] = -1;
            }
    }
    loco_pp_sim_fini(&sim);
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

int loco__pp_bind(loco__pp *pp, loco_gpt *model, const loco_mesh *mesh, int B, int T) {
    pp->model = model;
    pp->pp = mesh->group[LOCO_DIM_PP];
    pp->B = B, pp->T = T;
    const int t = model->cfg.tp > 1 ? model->cfg.tp : 1;
    const size_t rows = (size_t)B * T / (model->par.sp ? (size_t)t : 1);
    LOCO_CHECK(loco_pp_exec_create(&pp->exec, pp->sched, pp->pp, rows * (size_t)model->cfg.n_embd));
    /* The stage with the embeddings and the one with the head, when they
     * are two ranks, sum their wte gradients and share its values. */
    const int first = loco_pp_chunk_rank(pp->sched, 0);
    const int last = loco_pp_chunk_rank(pp->sched, pp->n_chunks - 1);
    if (first != last) {
        const bool member = pp->rank == first || pp->rank == last;
        LOCO_CHECK(loco_comm_split(pp->pp, member ? 0 : LOCO_COMM_COLOR_NONE, pp->rank == first ? 0 : 1,
                                   &pp->tied));
        pp->tied_root = 0;
        if (member)
            pp->wte = &model->tt.t[loco_ttable_find(&model->tt, "transformer.wte.weight")];
    }
    return 0;
}

/* ------------------------------------------------------------ callbacks */

static int slot_take(loco__pp *pp, int mb, int chunk) {
    const int slots = pp->model->stage.slots;
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
    const int slot = slot_take(pp, mb, chunk);
    LOCO_CHECK(slot);
    float loss = 0;
    LOCO_CHECK(loco_gpt_chunk_forward(pp->model, slot, pp->local[chunk], tokens(pp, pp->inputs, mb),
                                      tokens(pp, pp->targets, mb), pp->B, pp->T, in, out, pp->scale,
                                      &loss));
    if (chunk == pp->n_chunks - 1)
        pp->loss_sum += loss;
    return 0;
}

static int on_backward_input(void *ctx, int mb, int chunk, const float *dout, float *din) {
    loco__pp *pp = ctx;
    const int slot = slot_in_use(pp, mb, chunk);
    LOCO_CHECK(slot);
    return loco_gpt_chunk_backward_input(pp->model, slot, pp->local[chunk],
                                         tokens(pp, pp->inputs, mb), pp->B, pp->T, dout, din);
}

static int on_backward_weight(void *ctx, int mb, int chunk) {
    loco__pp *pp = ctx;
    const int slot = slot_in_use(pp, mb, chunk);
    LOCO_CHECK(slot);
    LOCO_CHECK(loco_gpt_chunk_backward_weight(pp->model, slot, pp->local[chunk], pp->B, pp->T));
    pp->busy[slot] = false;
    pp->slot_of[mb * pp->n_chunks + chunk] = -1;
    return 0;
}

/* --------------------------------------------------------------- steps */

int loco__pp_step(loco__pp *pp, const int32_t *inputs, const int32_t *targets, double *loss) {
    pp->inputs = inputs, pp->targets = targets;
    pp->loss_sum = 0;
    pp->scale = 1.0f / (float)pp->m;
    for (int i = 0; i < pp->m * pp->n_chunks; i++)
        pp->slot_of[i] = -1;
    memset(pp->busy, 0, (size_t)pp->model->stage.slots * sizeof(bool));
    const loco_pp_stage_ops ops = {.ctx = pp, .forward = on_forward,
                                   .backward_input = on_backward_input,
                                   .backward_weight = on_backward_weight};
    LOCO_CHECK(loco_pp_execute(pp->exec, &ops, NULL));
    if (pp->tied)
        LOCO_CHECK(loco_comm_allreduce(pp->tied, pp->model->grads + pp->wte->offset,
                                       pp->wte->numel, LOCO_DT_F32, LOCO_OP_SUM));
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
    const int t = m->cfg.tp > 1 ? m->cfg.tp : 1;
    const size_t n = (size_t)pp->B * pp->T / (m->par.sp ? (size_t)t : 1) * m->cfg.n_embd;
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
    return loco_comm_broadcast(pp->tied, pp->model->params + pp->wte->offset, pp->wte->numel,
                               LOCO_DT_F32, pp->tied_root);
}
