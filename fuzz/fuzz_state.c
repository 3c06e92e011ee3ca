/* libFuzzer target: the control and state-transfer messages a rejoining
 * island and the coordinator exchange, on arbitrary bytes. The first byte
 * picks the parser: a STATE_REQ request, a STATE header, a QUORUM
 * announcement, or a state chunk decoded into a 2n-element state buffer
 * with the lossless state codec. Whatever the bytes: 0 or LOCO_EPROTO
 * (LOCO_EINVAL for the decoder's own argument checks), nothing read out of
 * bounds (ASan), nothing leaked, and a refused chunk leaves the buffer
 * untouched. */
#include <stdlib.h>
#include <string.h>

#include "faulttol/faulttol.h"
#include "outer/outer.h"

#define STATE_N 300 /* elements per tensor: chunks can be small and many */

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static loco_codec *codec;

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1)
        return 0;
    if (!codec && loco_state_codec_create(&codec, STATE_N) != 0)
        abort();
    const uint8_t kind = data[0] % 4;
    data++;
    size--;
    const size_t live = loco_alloc_live_bytes();
    int rc = 0;
    if (kind == 0) {
        int64_t step = 0;
        size_t from = 0;
        rc = loco_state_request_parse(data, size, &step, &from);
        if (rc == 0 && step < -1)
            abort();
    } else if (kind == 1) {
        loco_state_meta m;
        rc = loco_state_meta_parse(data, size, &m);
        if (rc == 0 && m.outer_step < 0)
            abort();
    } else if (kind == 2) {
        loco_quorum q;
        rc = loco_quorum_from_json(&q, (const char *)data, size);
        if (rc == 0) {
            if (q.n < 1 || q.n > LOCO_MAX_ISLANDS)
                abort();
            for (int i = 0; i < q.n; i++)
                for (int r = 0; r < q.m[i].n_ranks; r++)
                    if (strnlen(q.m[i].addrs[r], LOCO_ADDR_MAX) >= LOCO_ADDR_MAX)
                        abort();
            loco_quorum_fini(&q);
        }
    } else {
        static float dst[2 * STATE_N], before[2 * STATE_N];
        for (size_t i = 0; i < 2 * STATE_N; i++)
            dst[i] = before[i] = -0.0f;
        rc = loco_codec_decode_chunk(codec, 0, dst, 2 * STATE_N, 1.0f, data, size);
        if (rc == LOCO_EINVAL || rc == LOCO_EREFUSED) /* EREFUSED: a non-finite value */
            rc = LOCO_EPROTO;
        if (rc != 0 && memcmp(dst, before, sizeof dst))
            abort(); /* a refused chunk touched the state */
    }
    if (rc != 0 && rc != LOCO_EPROTO)
        abort();
    if (loco_alloc_live_bytes() != live)
        abort(); /* leaked */
    return 0;
}
