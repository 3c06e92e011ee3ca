/* libFuzzer target: the frame header parser and payload verification of
 * net/ on arbitrary bytes, as they would arrive on a link.
 *
 * The input is a header (first LOCO_FRAME_HEADER_BYTES bytes) followed by
 * whatever payload bytes there are. Whatever the bytes, parsing and
 * verification return 0 or LOCO_EPROTO, never read out of bounds (ASan) and
 * never allocate; a header that parses encodes back to the same bytes; a
 * payload whose length differs from the header's is always refused; the
 * link's HELLO parser holds up the same way. Built with
 * -DFUZZING_BUILD_MODE_UNSAFE_FOR_PRODUCTION the checksums are computed but
 * not enforced, so mutations get past them to the field checks. */
#include <stdlib.h>
#include <string.h>

#include "net/internal.h"
#include "net/net.h"

/* The payload limit the parser enforces: small, so that the length check
 * fires often. */
#define FUZZ_MAX_PAYLOAD 4096u

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    loco_frame_hdr h;
    const size_t live = loco_alloc_live_bytes();
    const int rc = loco_frame_parse_header(&h, data, size, FUZZ_MAX_PAYLOAD);
    if (rc != 0 && rc != LOCO_EPROTO)
        abort();
    if (rc == 0) {
        if (size < LOCO_FRAME_HEADER_BYTES || h.payload_len > FUZZ_MAX_PAYLOAD)
            abort();
        if (h.type == 0 || h.type >= LOCO_FRAME_TYPE_END || h.flags != 0)
            abort();
        if (h.n_chunks != 0 && h.chunk >= h.n_chunks)
            abort();
        /* Parsed fields encode back to the same bytes (all but the header
         * checksum, which this build does not enforce). */
        uint8_t again[LOCO_FRAME_HEADER_BYTES];
        if (loco_frame_encode_header(again, &h, FUZZ_MAX_PAYLOAD) != 0)
            abort();
        if (memcmp(again, data, LOCO_FRAME_HEADER_BYTES - 8) != 0)
            abort();
        const uint8_t *payload = data + LOCO_FRAME_HEADER_BYTES;
        const size_t avail = size - LOCO_FRAME_HEADER_BYTES;
        const int vrc = loco_frame_verify_payload(&h, avail ? payload : NULL, avail);
        if (vrc != 0 && vrc != LOCO_EPROTO)
            abort();
        if (avail != h.payload_len && vrc == 0)
            abort(); /* a payload of the wrong length was accepted */
    }
    if (size >= LOCO__HELLO_FRAME) {
        loco__hello hello;
        const int hrc = loco__hello_parse(&hello, data);
        if (hrc != 0 && hrc != LOCO_EPROTO)
            abort();
        if (hrc == 0 && (hello.n_streams < 1 || hello.n_streams > LOCO_NET_MAX_STREAMS ||
                         hello.stream >= hello.n_streams || !memchr(hello.name, 0, sizeof hello.name)))
            abort();
    }
    if (loco_alloc_live_bytes() != live)
        abort(); /* parsing allocated */
    loco_err_clear();
    return 0;
}
