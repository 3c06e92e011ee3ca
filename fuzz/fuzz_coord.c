/* libFuzzer target: the coordinator's parsers of what islands send, on
 * arbitrary bytes. The first byte picks the message: a REGISTER (a
 * pending link's first frame) or an OUTER (ready, done or failed). Whatever
 * the bytes: 0 or LOCO_EPROTO, nothing read out of bounds (ASan), nothing
 * leaked, and what parses holds what the coordinator relies on (fields in
 * range, strings terminated, ranks within the limit). The QUORUM, STATE_REQ
 * and STATE messages are fuzz_state's. */
#include <stdlib.h>
#include <string.h>

#include "faulttol/coord_internal.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1)
        return 0;
    const uint8_t kind = data[0] % 2;
    const char *json = (const char *)data + 1;
    size--;
    int rc;
    if (kind == 0) {
        loco__register_msg m;
        rc = loco__coord_register_parse(&m, json, size);
        if (rc == 0) {
            if (!m.site || !m.mesh || strlen(m.mesh) >= sizeof((loco_coord *)0)->ref_mesh)
                abort();
            if (m.n_ranks < 1 || m.n_ranks > LOCO_MAX_ISLAND_RANKS ||
                m.n_ranks != cJSON_GetArraySize(m.ranks))
                abort();
            const loco_island_progress *r = &m.reg;
            if (r->committed < 0 || r->pending < 0 || r->end_step < 0 || r->epoch > (uint64_t)1e15)
                abort();
        }
        cJSON_Delete(m.root);
    } else {
        loco__outer_msg m;
        rc = loco__coord_outer_parse(&m, json, size);
        if (rc == 0 &&
            ((strcmp(m.phase, "ready") && strcmp(m.phase, "done") && strcmp(m.phase, "failed")) ||
             m.outer_step < 0 || m.have < 0 || m.epoch > (uint64_t)1e15))
            abort();
    }
    if (rc != 0 && rc != LOCO_EPROTO)
        abort();
    loco_err_clear();
    return 0;
}
