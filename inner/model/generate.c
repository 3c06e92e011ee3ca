/* Using a trained model (loco_ckpt_load_model loads one): validation loss
 * over a data set (with the text bytes the targets stand for), and
 * sampling text token by token. The front ends (`loco eval`, `loco
 * sample`) parse arguments and print; the work is here. */
#include "inner/model/internal.h"

#include <math.h>
#include <string.h>

int loco_gpt_eval(loco_gpt *m, loco_data *d, long long batches, const uint32_t *token_bytes,
                  loco_eval_result *r) {
    memset(r, 0, sizeof *r);
    if (batches < 1)
        return LOCO_ERR(LOCO_EINVAL, "eval: %lld batches, expected at least 1", batches);
    const int B = m->B, T = m->T;
    const int64_t bt = (int64_t)B * T;
    int32_t *in = loco_alloc((size_t)bt * sizeof(int32_t));
    int32_t *tg = loco_alloc((size_t)bt * sizeof(int32_t));
    int rc = 0;
    if (!in || !tg)
        rc = LOCO_ERR(LOCO_ENOMEM, "eval: batch buffers (%d x %d)", B, T);
    double sum = 0;
    long long bytes = 0;
    for (long long b = 0; b < batches && rc == 0; b++) {
        float loss;
        rc = loco_data_next(d, in, tg);
        if (rc == 0)
            rc = loco_gpt_forward(m, in, tg, B, T, &loss);
        if (rc < 0)
            break;
        sum += loss;
        for (int64_t i = 0; i < bt; i++)
            bytes += token_bytes ? (long long)token_bytes[tg[i]] : 1;
    }
    loco_free(in);
    loco_free(tg);
    if (rc < 0)
        return rc;
    r->batches = batches;
    r->loss = sum / (double)batches;
    r->tokens = batches * B * T;
    r->bytes = bytes;
    /* nats per byte = loss per token * tokens / bytes */
    r->nats_per_byte = r->loss * (double)r->tokens / (double)bytes;
    return 0;
}

int loco_sample_token(const float *logits, int V, float temperature, int top_k, loco_rng *rng,
                      float *probs) {
    float maxv = -INFINITY;
    for (int v = 0; v < V; v++)
        maxv = logits[v] > maxv ? logits[v] : maxv;
    float cutoff = -INFINITY;
    if (top_k > 0 && top_k < V) { /* k-th largest by repeated selection; V is small here */
        memcpy(probs, logits, (size_t)V * sizeof(float));
        for (int k = 0; k < top_k; k++) {
            int best = 0;
            for (int v = 1; v < V; v++)
                best = probs[v] > probs[best] ? v : best;
            cutoff = probs[best];
            probs[best] = -INFINITY;
        }
    }
    double sum = 0;
    for (int v = 0; v < V; v++) {
        probs[v] = logits[v] >= cutoff ? expf((logits[v] - maxv) / temperature) : 0.0f;
        sum += probs[v];
    }
    double r = loco_rng_uniform_d(rng) * sum, acc = 0;
    for (int v = 0; v < V; v++) {
        acc += probs[v];
        if (r < acc)
            return v;
    }
    return V - 1;
}

int loco_gpt_generate(loco_gpt *m, int32_t *ctx, size_t *n, size_t cap, long long ntok,
                      const loco_sample_opts *o, loco_rng *rng, loco_gen_token_fn on_token,
                      void *arg) {
    const int V = m->cfg.vocab_size, T = m->T;
    if (*n == 0 || ntok < 0 || *n + (size_t)ntok > cap)
        return LOCO_ERR(LOCO_EINVAL,
                        "generate: context of %zu ids + %lld new in a buffer of %zu; expected "
                        "at least one id and room for every new one",
                        *n, ntok, cap);
    if (!(o->temperature > 0) || !isfinite(o->temperature) || o->top_k < 0)
        return LOCO_ERR(LOCO_EINVAL,
                        "generate: temperature %g, top_k %d; expected a finite "
                        "temperature > 0 and top_k >= 0",
                        (double)o->temperature, o->top_k);
    if (m->B < 1 || T < 1)
        return LOCO_ERR(LOCO_EINVAL,
                        "generate: the model holds %d x %d activations, expected "
                        "at least 1 x 1",
                        m->B, T);
    for (size_t i = 0; i < *n; i++)
        if (ctx[i] < 0 || ctx[i] >= V)
            return LOCO_ERR(LOCO_EINVAL, "generate: context id %d at %zu, expected 0..%d", ctx[i],
                            i, V - 1);
    float *probs = loco_alloc((size_t)V * sizeof(float));
    if (!probs)
        return LOCO_ERR(LOCO_ENOMEM, "generate: %d probabilities", V);
    int rc = 0;
    for (long long k = 0; k < ntok && rc == 0; k++) {
        const size_t start = *n > (size_t)T ? *n - (size_t)T : 0;
        const int len = (int)(*n - start);
        rc = loco_gpt_forward(m, ctx + start, NULL, 1, len, NULL);
        if (rc < 0)
            break;
        const int next = loco_sample_token(m->a.logits + (size_t)(len - 1) * V, V, o->temperature,
                                           o->top_k, rng, probs);
        ctx[(*n)++] = next;
        if (on_token)
            rc = on_token(next, arg);
    }
    loco_free(probs);
    return rc;
}
