/* The frame header: the byte table of docs/NET.md read back by hand, every
 * check of the parser, payload verification, and untrusted bytes (random,
 * truncated, single-byte mutations) that must never crash or pass. */
#include "tests/net/net_test.h"

static uint64_t le64(const uint8_t *p) {
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--)
        v = (v << 8) | p[i];
    return v;
}
static uint32_t le32(const uint8_t *p) {
    return (uint32_t)le64((const uint8_t[8]){p[0], p[1], p[2], p[3]});
}
static uint16_t le16(const uint8_t *p) {
    return (uint16_t)(p[0] | p[1] << 8);
}

static loco_frame_hdr full_hdr(void) {
    loco_frame_hdr h = {
        .type = LOCO_FRAME_PSEUDOGRAD,
        .codec = 2,
        .shard = 0x01020304,
        .run_id = 0x1111222233334444ULL,
        .epoch = 0x5555666677778888ULL,
        .step = 0x99990000aaaabbbbULL,
        .chunk = 6,
        .n_chunks = 9,
        .seq = 0x0102030405060708ULL,
        .payload_len = 4096,
        .raw_len = 16384,
        .payload_hash = 0xdeadbeefcafef00dULL,
    };
    return h;
}

TestSuite(net_frame, .init = loco_err_clear, .timeout = 20);

Test(net_frame, byte_table_is_little_endian_and_exact) {
    const loco_frame_hdr h = full_hdr();
    uint8_t b[LOCO_FRAME_HEADER_BYTES];
    cr_assert_eq(loco_frame_encode_header(b, &h, 1 << 20), 0, "%s", loco_errmsg());
    cr_assert_eq(memcmp(b, "LOCF", 4), 0);
    cr_assert_eq(le16(b + 4), LOCO_FRAME_VERSION);
    cr_assert_eq(le16(b + 6), LOCO_FRAME_PSEUDOGRAD);
    cr_assert_eq(le16(b + 8), 0);
    cr_assert_eq(le16(b + 10), 2);
    cr_assert_eq(le32(b + 12), 0x01020304u);
    cr_assert_eq(le64(b + 16), h.run_id);
    cr_assert_eq(le64(b + 24), h.epoch);
    cr_assert_eq(le64(b + 32), h.step);
    cr_assert_eq(le32(b + 40), 6u);
    cr_assert_eq(le32(b + 44), 9u);
    cr_assert_eq(le64(b + 48), h.seq);
    cr_assert_eq(le64(b + 56), 4096u);
    cr_assert_eq(le64(b + 64), 16384u);
    cr_assert_eq(le64(b + 72), h.payload_hash);
    cr_assert_eq(le64(b + 80), 0u);
    cr_assert_eq(le64(b + 88), loco_hash64(b, 88));
}

Test(net_frame, round_trip) {
    const loco_frame_hdr h = full_hdr();
    uint8_t b[LOCO_FRAME_HEADER_BYTES];
    cr_assert_eq(loco_frame_encode_header(b, &h, 4096), 0);
    loco_frame_hdr back;
    memset(&back, 0x77, sizeof back);
    cr_assert_eq(loco_frame_parse_header(&back, b, sizeof b, 4096), 0, "%s", loco_errmsg());
    cr_assert_eq(back.type, h.type);
    cr_assert_eq(back.flags, 0);
    cr_assert_eq(back.codec, h.codec);
    cr_assert_eq(back.shard, h.shard);
    cr_assert_eq(back.run_id, h.run_id);
    cr_assert_eq(back.epoch, h.epoch);
    cr_assert_eq(back.step, h.step);
    cr_assert_eq(back.chunk, h.chunk);
    cr_assert_eq(back.n_chunks, h.n_chunks);
    cr_assert_eq(back.seq, h.seq);
    cr_assert_eq(back.payload_len, h.payload_len);
    cr_assert_eq(back.raw_len, h.raw_len);
    cr_assert_eq(back.payload_hash, h.payload_hash);
    for (int t = LOCO_FRAME_HELLO; t < LOCO_FRAME_TYPE_END; t++)
        cr_assert_neq(strcmp(loco_frame_type_name(t), "?"), 0, "type %d has no name", t);
    cr_assert_str_eq(loco_frame_type_name(0), "?");
    cr_assert_str_eq(loco_frame_type_name(LOCO_FRAME_TYPE_END), "?");
    cr_assert_str_eq(loco_frame_type_name(LOCO_FRAME_BYE), "BYE");
}

Test(net_frame, encode_refuses_what_parse_would) {
    uint8_t b[LOCO_FRAME_HEADER_BYTES], before[LOCO_FRAME_HEADER_BYTES];
    memset(b, 0xab, sizeof b);
    memcpy(before, b, sizeof b);
    loco_frame_hdr h = full_hdr();
    h.type = 0;
    cr_assert_eq(loco_frame_encode_header(b, &h, 1 << 20), LOCO_EINVAL);
    h = full_hdr();
    h.type = LOCO_FRAME_TYPE_END;
    cr_assert_eq(loco_frame_encode_header(b, &h, 1 << 20), LOCO_EINVAL);
    h = full_hdr();
    h.flags = 1;
    cr_assert_eq(loco_frame_encode_header(b, &h, 1 << 20), LOCO_EINVAL);
    h = full_hdr();
    h.chunk = 9;
    cr_assert_eq(loco_frame_encode_header(b, &h, 1 << 20), LOCO_EINVAL);
    h = full_hdr();
    cr_assert_eq(loco_frame_encode_header(b, &h, 4095), LOCO_EINVAL);
    cr_assert_eq(memcmp(b, before, sizeof b), 0, "a refused header was written");
}

/* Edits one field of a valid header, recomputes the checksum so that the
 * field's own check is the one that fires, parses. */
static void refused_field(int off, int width, uint64_t value, const char *reason) {
    const loco_frame_hdr h = full_hdr();
    uint8_t b[LOCO_FRAME_HEADER_BYTES];
    cr_assert_eq(loco_frame_encode_header(b, &h, 1 << 20), 0);
    for (int i = 0; i < width; i++)
        b[off + i] = (uint8_t)(value >> (8 * i));
    t_rehash(b);
    loco_frame_hdr out, untouched;
    memset(&out, 0x5a, sizeof out);
    memcpy(&untouched, &out, sizeof out);
    loco_err_clear();
    cr_assert_eq(loco_frame_parse_header(&out, b, sizeof b, 1 << 20), LOCO_EPROTO,
                 "field at %d = %llu accepted", off, (unsigned long long)value);
    t_assert_has(loco_errmsg(), reason);
    cr_assert_eq(memcmp(&out, &untouched, sizeof out), 0, "refused header written out");
}

Test(net_frame, every_check_refuses_with_its_reason) {
    refused_field(0, 4, 0x46434f4d, "bad magic");
    refused_field(4, 2, 2, "version 2");
    refused_field(4, 2, 0, "version 0");
    refused_field(6, 2, 0, "unknown type 0");
    refused_field(6, 2, LOCO_FRAME_TYPE_END, "unknown type");
    refused_field(6, 2, 0xffff, "unknown type 65535");
    refused_field(8, 2, 0x8000, "flags");
    refused_field(80, 8, 1, "reserved");
    refused_field(40, 4, 9, "chunk 9 of 9");
    refused_field(56, 8, (1 << 20) + 1, "exceeds the limit");
    refused_field(56, 8, UINT64_MAX, "exceeds the limit");
}

Test(net_frame, header_checksum_catches_every_single_byte_change) {
    const loco_frame_hdr h = full_hdr();
    uint8_t b[LOCO_FRAME_HEADER_BYTES];
    cr_assert_eq(loco_frame_encode_header(b, &h, 1 << 20), 0);
    for (int i = 0; i < LOCO_FRAME_HEADER_BYTES; i++) {
        for (int bit = 0; bit < 8; bit++) {
            uint8_t m[LOCO_FRAME_HEADER_BYTES];
            memcpy(m, b, sizeof m);
            m[i] ^= (uint8_t)(1 << bit);
            loco_frame_hdr out;
            cr_assert_eq(loco_frame_parse_header(&out, m, sizeof m, 1 << 20), LOCO_EPROTO,
                         "byte %d bit %d flipped and accepted", i, bit);
        }
    }
    b[33] ^= 1; /* step: only the checksum can tell */
    loco_frame_hdr out;
    cr_assert_eq(loco_frame_parse_header(&out, b, sizeof b, 1 << 20), LOCO_EPROTO);
    t_assert_has(loco_errmsg(), "header checksum mismatch");
}

Test(net_frame, truncated_and_random_bytes_never_crash) {
    const loco_frame_hdr h = full_hdr();
    uint8_t good[LOCO_FRAME_HEADER_BYTES];
    cr_assert_eq(loco_frame_encode_header(good, &h, 1 << 20), 0);
    /* Every prefix, in a buffer of exactly that size (ASan sees overreads). */
    for (size_t len = 0; len < LOCO_FRAME_HEADER_BYTES; len++) {
        uint8_t *b = malloc(len ? len : 1);
        memcpy(b, good, len);
        loco_frame_hdr out;
        cr_assert_eq(loco_frame_parse_header(&out, b, len, 1 << 20), LOCO_EPROTO);
        t_assert_has(loco_errmsg(), "truncated");
        free(b);
    }
    loco_frame_hdr out;
    cr_assert_eq(loco_frame_parse_header(&out, NULL, 200, 1 << 20), LOCO_EPROTO);
    /* Random bytes of random lengths, half of them with a valid magic and
     * version so that later checks run too. */
    loco_rng r;
    loco_rng_seed(&r, 42);
    int accepted = 0;
    for (int it = 0; it < 20000; it++) {
        const size_t len = (size_t)(loco_rng_u64(&r) % 200);
        uint8_t *b = malloc(len ? len : 1);
        t_fill(b, len, loco_rng_u64(&r));
        if ((it & 1) && len >= 6) {
            memcpy(b, "LOCF", 4);
            b[4] = 1;
            b[5] = 0;
            if (len >= LOCO_FRAME_HEADER_BYTES && (it & 2))
                t_rehash(b);
        }
        const int rc = loco_frame_parse_header(&out, b, len, loco_rng_u64(&r) % (1 << 24));
        cr_assert(rc == 0 || rc == LOCO_EPROTO, "rc %d", rc);
        accepted += rc == 0;
        if (rc == 0) {
            cr_assert(out.type > 0 && out.type < LOCO_FRAME_TYPE_END);
            cr_assert(out.n_chunks == 0 || out.chunk < out.n_chunks);
        }
        free(b);
    }
    cr_assert_lt(accepted, 20000);
}

Test(net_frame, payload_verification) {
    uint8_t pl[1000];
    t_fill(pl, sizeof pl, 5);
    loco_frame_hdr h = full_hdr();
    h.payload_len = sizeof pl;
    h.payload_hash = loco_frame_hash_payload(pl, sizeof pl);
    cr_assert_eq(h.payload_hash, loco_hash64(pl, sizeof pl));
    cr_assert_eq(loco_frame_verify_payload(&h, pl, sizeof pl), 0, "%s", loco_errmsg());
    pl[999] ^= 0x10;
    cr_assert_eq(loco_frame_verify_payload(&h, pl, sizeof pl), LOCO_EPROTO);
    t_assert_has(loco_errmsg(), "payload checksum mismatch");
    pl[999] ^= 0x10;
    cr_assert_eq(loco_frame_verify_payload(&h, pl, sizeof pl - 1), LOCO_EPROTO);
    cr_assert_eq(loco_frame_verify_payload(&h, NULL, sizeof pl), LOCO_EPROTO);
    h.payload_len = 0;
    h.payload_hash = loco_frame_hash_payload(NULL, 0);
    cr_assert_eq(loco_frame_verify_payload(&h, NULL, 0), 0, "%s", loco_errmsg());
}

Test(net_frame, hello_parses_only_well_formed) {
    loco__hello in = {.link_id = 99,
                      .stream = 2,
                      .n_streams = 4,
                      .max_frame = 1 << 20,
                      .run_id = 5,
                      .name = "siteA",
                      .reason = "fine"};
    uint8_t b[LOCO__HELLO_FRAME];
    loco__hello_encode(b, &in);
    loco__hello out;
    cr_assert_eq(loco__hello_parse(&out, b), 0, "%s", loco_errmsg());
    cr_assert_eq(out.link_id, 99u);
    cr_assert_eq(out.stream, 2u);
    cr_assert_eq(out.n_streams, 4u);
    cr_assert_eq(out.run_id, 5u);
    cr_assert_str_eq(out.name, "siteA");
    cr_assert_str_eq(out.reason, "fine");
    in.stream = 4; /* stream >= n_streams */
    loco__hello_encode(b, &in);
    cr_assert_eq(loco__hello_parse(&out, b), LOCO_EPROTO);
    in.stream = 0;
    in.n_streams = LOCO_NET_MAX_STREAMS + 1;
    loco__hello_encode(b, &in);
    cr_assert_eq(loco__hello_parse(&out, b), LOCO_EPROTO);
    in.n_streams = 1;
    loco__hello_encode(b, &in);
    b[LOCO_FRAME_HEADER_BYTES + 40] ^= 1; /* the name, under the payload checksum */
    cr_assert_eq(loco__hello_parse(&out, b), LOCO_EPROTO);
}
