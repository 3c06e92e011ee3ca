/* `loco tokenizer train|encode|decode`: argument parsing and the calls into
 * tokenizer/. train and encode take --pattern NAME (the pre-tokenizer). */
#include "tokenizer/tokenizer.h"
#include "cli/cli.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int tok_usage(const char *msg, const char *arg) {
    fprintf(stderr,
            "loco tokenizer: %s%s%s\n"
            "usage: loco tokenizer train TEXT --vocab N --out FILE [--pattern NAME]\n"
            "       loco tokenizer encode --tokenizer FILE [--pattern NAME] [TEXT_FILE]   (ids, "
            "one line)\n"
            "       loco tokenizer decode --tokenizer FILE [IDS_FILE]    (bytes)\n"
            "FILE: tokenizer.json, ENCODER_JSON,VOCAB_BPE or a tiktoken file; input from "
            "stdin without a file\n"
            "NAME: the pre-tokenizer regex: auto (what FILE declares; gpt2 for tiktoken files and "
            "for train), "
            "%s\n",
            msg, arg ? ": " : "", arg ? arg : "", LOCO_TOK_PATTERN_NAMES);
    return CLI_USAGE;
}

/* Reads a whole file, or stdin for NULL / "-". */
static int read_input(const char *path, uint8_t **data, size_t *len) {
    if (path && strcmp(path, "-"))
        return loco_file_read(path, (void **)data, len);
    size_t cap = 1 << 16, n = 0;
    uint8_t *buf = loco_alloc(cap);
    while (buf) {
        size_t r = fread(buf + n, 1, cap - n, stdin);
        n += r;
        if (r == 0)
            break;
        if (n == cap) {
            uint8_t *nb = loco_alloc(cap * 2);
            if (nb)
                memcpy(nb, buf, n);
            loco_free(buf);
            buf = nb;
            cap *= 2;
        }
    }
    if (!buf)
        return LOCO_ERR(LOCO_ENOMEM, "stdin: out of memory");
    *data = buf;
    *len = n;
    return 0;
}

static int tok_train(int argc, char **argv) {
    const char *text = NULL, *out = NULL, *pattern = NULL;
    long vocab = 0;
    for (int i = 0; i < argc; i++) {
        if (!strcmp(argv[i], "--vocab") && i + 1 < argc) {
            char *end;
            vocab = strtol(argv[++i], &end, 10);
            if (*end || vocab < 258 || vocab > (1 << 24))
                return tok_usage("--vocab expects an integer in 258..16777216", argv[i]);
        } else if (!strcmp(argv[i], "--out") && i + 1 < argc)
            out = argv[++i];
        else if (!strcmp(argv[i], "--pattern") && i + 1 < argc)
            pattern = argv[++i];
        else if (argv[i][0] != '-' && !text)
            text = argv[i];
        else
            return tok_usage("unexpected argument", argv[i]);
    }
    if (!text || !out || !vocab)
        return tok_usage("train expects TEXT --vocab N --out FILE", NULL);
    uint8_t *data;
    size_t len;
    int rc = loco_file_read(text, (void **)&data, &len);
    if (rc < 0)
        return cli_fail(rc);
    loco_tok *t;
    double t0 = loco_now();
    rc = loco_tok_train(&t, data, len, (int)vocab, pattern);
    loco_free(data);
    if (rc < 0)
        return cli_fail(rc);
    rc = loco_tok_save_hf(t, out);
    if (rc == 0)
        fprintf(stderr,
                "tokenizer: %d ids (%d merges) from %zu bytes of %s split by %s in %.1f s -> %s\n",
                loco_tok_vocab_size(t), loco_tok_num_merges(t), len, text, loco_tok_pattern_name(t),
                loco_now() - t0, out);
    loco_tok_destroy(t);
    return rc < 0 ? cli_fail(rc) : CLI_OK;
}

static int tok_codec(int encode, int argc, char **argv) {
    const char *spec = NULL, *in = NULL, *pattern = NULL;
    for (int i = 0; i < argc; i++) {
        if (!strcmp(argv[i], "--tokenizer") && i + 1 < argc)
            spec = argv[++i];
        else if (!strcmp(argv[i], "--pattern") && i + 1 < argc)
            pattern = argv[++i];
        else if ((argv[i][0] != '-' || !strcmp(argv[i], "-")) && !in)
            in = argv[i];
        else
            return tok_usage("unexpected argument", argv[i]);
    }
    if (!spec)
        return tok_usage("missing --tokenizer FILE", NULL);
    loco_tok *t;
    int rc = loco_tok_load_pattern(&t, spec, pattern);
    if (rc < 0)
        return cli_fail(rc);
    uint8_t *data = NULL, *text = NULL;
    int32_t *ids = NULL;
    size_t len = 0, n = 0;
    rc = read_input(in, &data, &len);
    if (rc == 0 && encode) {
        rc = loco_tok_encode(t, data, len, &ids, &n);
        for (size_t i = 0; rc == 0 && i < n; i++)
            printf(i ? " %d" : "%d", ids[i]);
        if (rc == 0)
            printf("\n");
    } else if (rc == 0) {
        rc = loco_tok_parse_ids((const char *)data, len, in ? in : "stdin", &ids, &n);
        if (rc == 0)
            rc = loco_tok_decode(t, ids, n, &text, &len);
        if (rc == 0)
            fwrite(text, 1, len, stdout);
    }
    loco_free(data);
    loco_free(text);
    loco_free(ids);
    loco_tok_destroy(t);
    return rc < 0 ? cli_fail(rc) : CLI_OK;
}

int cli_tokenizer(int argc, char **argv) {
    if (argc < 1)
        return tok_usage("expected train, encode or decode", NULL);
    if (!strcmp(argv[0], "train"))
        return tok_train(argc - 1, argv + 1);
    if (!strcmp(argv[0], "encode"))
        return tok_codec(1, argc - 1, argv + 1);
    if (!strcmp(argv[0], "decode"))
        return tok_codec(0, argc - 1, argv + 1);
    return tok_usage("unknown subcommand (train, encode, decode)", argv[0]);
}
