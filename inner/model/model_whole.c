/* The whole model's layout (tp = 1, no pipeline stage, every expert: the
 * order export and checkpoints use) and where each element of a rank's
 * slice sits in it. The exchange between islands of different meshes
 * works in this layout (outer.layout = whole). */
#include "inner/model/internal.h"

#include <string.h>

int loco_gpt_build_whole_table(const loco_gpt *m, loco_ttable *whole) {
    loco_gpt_config one = m->cfg;
    one.tp = 1;
    one.ep = 1, one.ep_rank = 0; /* every expert */
    return loco_gpt_build_table(whole, &one);
}

int loco_gpt_whole_index(const loco_gpt *m, const loco_ttable *whole, size_t lo, size_t hi,
                         int64_t *idx) {
    if (lo > hi || hi > m->tt.numel)
        return LOCO_ERR(LOCO_EINVAL, "range [%zu, %zu) of a table of %zu elements", lo, hi,
                        m->tt.numel);
    for (size_t k = lo; k < hi; k++)
        idx[k - lo] = -1; /* vocabulary padding keeps -1 */
    const int t = m->cfg.tp > 1 ? m->cfg.tp : 1;
    for (int i = 0; i < m->tt.n; i++) {
        const loco_tensor *mine = &m->tt.t[i];
        if (mine->offset >= hi || mine->offset + mine->numel <= lo)
            continue;
        /* by name: a stage's tensors, an ep rank's experts (global
         * expert numbers in their names), the tied head's copy of wte */
        const int w = loco_ttable_find(whole, mine->name);
        if (w < 0)
            return LOCO_ERR(LOCO_EINVAL, "tensor %s is not in the whole model's table",
                            mine->name);
        const loco_tensor *gt = &whole->t[w];
        const size_t a = lo > mine->offset ? lo - mine->offset : 0;
        const size_t b = hi - mine->offset < mine->numel ? hi - mine->offset : mine->numel;
        for (size_t j = a; j < b; j++) {
            size_t g;
            if (loco_gpt_tp_global(gt, t, m->tp_rank, j, &g)) {
                if (g >= gt->numel)
                    return LOCO_ERR(LOCO_EINVAL, "%s: element %zu maps past the whole tensor",
                                    mine->name, j);
                idx[mine->offset + j - lo] = (int64_t)(gt->offset + g);
            }
        }
    }
    return 0;
}
