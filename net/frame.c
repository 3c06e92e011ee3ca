/* The frame header: explicit little-endian packing and a parser that trusts
 * nothing (docs/NET.md has the byte table).
 *
 * Built with -DFUZZING_BUILD_MODE_UNSAFE_FOR_PRODUCTION (fuzz/) the checksums
 * are computed but not enforced, so mutated inputs reach the field checks. */
#include "net/net.h"

#include <string.h>

/* Byte offsets of the fields. */
enum {
    OFF_MAGIC = 0,
    OFF_VERSION = 4,
    OFF_TYPE = 6,
    OFF_FLAGS = 8,
    OFF_CODEC = 10,
    OFF_SHARD = 12,
    OFF_RUN_ID = 16,
    OFF_EPOCH = 24,
    OFF_STEP = 32,
    OFF_CHUNK = 40,
    OFF_N_CHUNKS = 44,
    OFF_SEQ = 48,
    OFF_PAYLOAD_LEN = 56,
    OFF_RAW_LEN = 64,
    OFF_PAYLOAD_HASH = 72,
    OFF_RESERVED = 80,
    OFF_HEADER_HASH = 88,
};
_Static_assert(OFF_HEADER_HASH + 8 == LOCO_FRAME_HEADER_BYTES, "header layout");

#ifdef FUZZING_BUILD_MODE_UNSAFE_FOR_PRODUCTION
#define CHECKSUMS_ENFORCED 0
#else
#define CHECKSUMS_ENFORCED 1
#endif

static const char *const type_names[LOCO_FRAME_TYPE_END] = {
    [LOCO_FRAME_HELLO] = "HELLO",
    [LOCO_FRAME_REGISTER] = "REGISTER",
    [LOCO_FRAME_QUORUM] = "QUORUM",
    [LOCO_FRAME_HEARTBEAT] = "HEARTBEAT",
    [LOCO_FRAME_PSEUDOGRAD] = "PSEUDOGRAD",
    [LOCO_FRAME_STATE] = "STATE",
    [LOCO_FRAME_ACK] = "ACK",
    [LOCO_FRAME_ERROR] = "ERROR",
    [LOCO_FRAME_BYE] = "BYE",
    [LOCO_FRAME_OUTER] = "OUTER",
    [LOCO_FRAME_COMMIT] = "COMMIT",
    [LOCO_FRAME_STATE_REQ] = "STATE_REQ",
    [LOCO_FRAME_LINK] = "LINK",
};

const char *loco_frame_type_name(int type) {
    if (type <= 0 || type >= LOCO_FRAME_TYPE_END || !type_names[type])
        return "?";
    return type_names[type];
}

static bool type_known(unsigned type) {
    return type > 0 && type < LOCO_FRAME_TYPE_END && type_names[type];
}

uint64_t loco_frame_hash_payload(const void *payload, size_t len) {
    return loco_hash64(len ? payload : "", len);
}

int loco_frame_encode_header(uint8_t out[LOCO_FRAME_HEADER_BYTES], const loco_frame_hdr *h,
                             uint64_t max_payload) {
    if (!type_known(h->type))
        return LOCO_ERR(LOCO_EINVAL, "frame: unknown type %u", h->type);
    if (h->flags != 0)
        return LOCO_ERR(LOCO_EINVAL, "frame: flags 0x%x set (reserved, must be 0)", h->flags);
    if (h->n_chunks != 0 && h->chunk >= h->n_chunks)
        return LOCO_ERR(LOCO_EINVAL, "frame: chunk %u of %u", h->chunk, h->n_chunks);
    if (h->payload_len > max_payload)
        return LOCO_ERR(LOCO_EINVAL, "frame: payload of %llu bytes exceeds the limit of %llu",
                        (unsigned long long)h->payload_len, (unsigned long long)max_payload);
    uint8_t b[LOCO_FRAME_HEADER_BYTES];
    loco_put_le32(b + OFF_MAGIC, LOCO_FRAME_MAGIC);
    loco_put_le16(b + OFF_VERSION, LOCO_FRAME_VERSION);
    loco_put_le16(b + OFF_TYPE, h->type);
    loco_put_le16(b + OFF_FLAGS, h->flags);
    loco_put_le16(b + OFF_CODEC, h->codec);
    loco_put_le32(b + OFF_SHARD, h->shard);
    loco_put_le64(b + OFF_RUN_ID, h->run_id);
    loco_put_le64(b + OFF_EPOCH, h->epoch);
    loco_put_le64(b + OFF_STEP, h->step);
    loco_put_le32(b + OFF_CHUNK, h->chunk);
    loco_put_le32(b + OFF_N_CHUNKS, h->n_chunks);
    loco_put_le64(b + OFF_SEQ, h->seq);
    loco_put_le64(b + OFF_PAYLOAD_LEN, h->payload_len);
    loco_put_le64(b + OFF_RAW_LEN, h->raw_len);
    loco_put_le64(b + OFF_PAYLOAD_HASH, h->payload_hash);
    loco_put_le64(b + OFF_RESERVED, 0);
    loco_put_le64(b + OFF_HEADER_HASH, loco_hash64(b, OFF_HEADER_HASH));
    memcpy(out, b, sizeof b);
    return 0;
}

int loco_frame_parse_header(loco_frame_hdr *h, const void *buf, size_t len, uint64_t max_payload) {
    if (!buf || len < LOCO_FRAME_HEADER_BYTES)
        return LOCO_ERR(LOCO_EPROTO, "frame: truncated header (%zu of %d bytes)", buf ? len : 0,
                        LOCO_FRAME_HEADER_BYTES);
    const uint8_t *b = buf;
    const uint32_t magic = loco_get_le32(b + OFF_MAGIC);
    if (magic != LOCO_FRAME_MAGIC)
        return LOCO_ERR(LOCO_EPROTO, "frame: bad magic 0x%08x (expected 0x%08x)", magic,
                        LOCO_FRAME_MAGIC);
    const uint16_t version = loco_get_le16(b + OFF_VERSION);
    if (version != LOCO_FRAME_VERSION)
        return LOCO_ERR(LOCO_EPROTO, "frame: version %u not supported (this build speaks %d)",
                        version, LOCO_FRAME_VERSION);
    const uint64_t want = loco_get_le64(b + OFF_HEADER_HASH), got = loco_hash64(b, OFF_HEADER_HASH);
    if (CHECKSUMS_ENFORCED && want != got)
        return LOCO_ERR(LOCO_EPROTO,
                        "frame: header checksum mismatch (0x%016llx, computed 0x%016llx)",
                        (unsigned long long)want, (unsigned long long)got);
    const uint16_t type = loco_get_le16(b + OFF_TYPE);
    if (!type_known(type))
        return LOCO_ERR(LOCO_EPROTO, "frame: unknown type %u", type);
    const uint16_t flags = loco_get_le16(b + OFF_FLAGS);
    if (flags != 0)
        return LOCO_ERR(LOCO_EPROTO, "frame: flags 0x%x set (reserved)", flags);
    if (loco_get_le64(b + OFF_RESERVED) != 0)
        return LOCO_ERR(LOCO_EPROTO, "frame: reserved bytes not zero");
    const uint32_t chunk = loco_get_le32(b + OFF_CHUNK), n_chunks = loco_get_le32(b + OFF_N_CHUNKS);
    if (n_chunks != 0 && chunk >= n_chunks)
        return LOCO_ERR(LOCO_EPROTO, "frame: chunk %u of %u", chunk, n_chunks);
    const uint64_t plen = loco_get_le64(b + OFF_PAYLOAD_LEN);
    if (plen > max_payload)
        return LOCO_ERR(LOCO_EPROTO, "frame: %s payload of %llu bytes exceeds the limit of %llu",
                        loco_frame_type_name(type), (unsigned long long)plen,
                        (unsigned long long)max_payload);
    h->type = type;
    h->flags = flags;
    h->codec = loco_get_le16(b + OFF_CODEC);
    h->shard = loco_get_le32(b + OFF_SHARD);
    h->run_id = loco_get_le64(b + OFF_RUN_ID);
    h->epoch = loco_get_le64(b + OFF_EPOCH);
    h->step = loco_get_le64(b + OFF_STEP);
    h->chunk = chunk;
    h->n_chunks = n_chunks;
    h->seq = loco_get_le64(b + OFF_SEQ);
    h->payload_len = plen;
    h->raw_len = loco_get_le64(b + OFF_RAW_LEN);
    h->payload_hash = loco_get_le64(b + OFF_PAYLOAD_HASH);
    return 0;
}

int loco_frame_verify_payload(const loco_frame_hdr *h, const void *payload, size_t len) {
    if (len != h->payload_len)
        return LOCO_ERR(LOCO_EPROTO, "frame: payload of %zu bytes, header says %llu", len,
                        (unsigned long long)h->payload_len);
    if (len && !payload)
        return LOCO_ERR(LOCO_EPROTO, "frame: payload missing");
    const uint64_t got = loco_frame_hash_payload(payload, len);
    if (CHECKSUMS_ENFORCED && got != h->payload_hash)
        return LOCO_ERR(
            LOCO_EPROTO,
            "frame: %s payload checksum mismatch (header 0x%016llx, computed 0x%016llx)",
            loco_frame_type_name(h->type), (unsigned long long)h->payload_hash,
            (unsigned long long)got);
    return 0;
}
