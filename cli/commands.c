/* The subcommands: argument parsing and the calls into the library. */
#include "bench/bench.h"
#include "cli/cli.h"
#include "inner/ckpt/ckpt.h"
#include "inner/data/data.h"
#include "inner/model/model.h"
#include "inner/train/train.h"
#include "tokenizer/tokenizer.h"

#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define MAX_SETS 256

static int usage_error(const char *cmd, const char *msg, const char *arg) {
    fprintf(stderr, "loco %s: %s%s%s\n(run `loco help` for usage)\n", cmd, msg, arg ? ": " : "",
            arg ? arg : "");
    return CLI_USAGE;
}

/* Parses a positive integer option value; false when it is not one. */
static bool parse_count(const char *s, long long lo, long long hi, long long *out) {
    char *end;
    long long v = strtoll(s, &end, 10);
    if (end == s || *end || v < lo || v > hi)
        return false;
    *out = v;
    return true;
}

int cli_train(int argc, char **argv) {
    const char *config = NULL, *resume = NULL, *init = NULL;
    char *sets[MAX_SETS];
    int nsets = 0;
    for (int i = 0; i < argc; i++) {
        if (!strcmp(argv[i], "--set") && i + 1 < argc && nsets < MAX_SETS)
            sets[nsets++] = argv[++i];
        else if (!strcmp(argv[i], "--resume") && i + 1 < argc)
            resume = argv[++i];
        else if (!strcmp(argv[i], "--init") && i + 1 < argc)
            init = argv[++i];
        else if (argv[i][0] != '-' && !config)
            config = argv[i];
        else
            return usage_error("train", "unexpected argument", argv[i]);
    }
    if (!config)
        return usage_error("train", "missing CONFIG", NULL);
    loco_config cfg;
    int rc = cli_load_config(&cfg, config, nsets, sets);
    if (rc < 0)
        return cli_fail(rc);
    /* --init DIR is --set train.init_from=DIR. */
    if (init && snprintf(cfg.train.init_from, sizeof cfg.train.init_from, "%s", init) >=
                    (int)sizeof cfg.train.init_from)
        return usage_error("train", "--init path too long", init);
    /* The newest checkpoint that verifies, at or before the one named. */
    char ck[PATH_MAX];
    if (resume && (rc = loco_ckpt_pick_resume(resume, ck, sizeof ck)) < 0)
        return cli_fail(rc);
    loco_trainer *t;
    rc = loco_trainer_create(&t, &cfg, resume ? ck : NULL);
    if (rc < 0)
        return cli_fail(rc);
    cli_metrics *metrics = NULL;
    rc = cli_metrics_serve_run(&metrics, loco_trainer_prom(t), cfg.run.metrics_addr,
                               "run.metrics_addr", cfg.run.dir);
    if (rc == 0)
        rc = loco_trainer_run(t);
    cli_metrics_stop(metrics); /* before the registry it serves goes */
    loco_trainer_destroy(t);
    return rc < 0 ? cli_fail(rc) : CLI_OK;
}

/* DIR/tokenizer.json when the checkpoint has one (*t NULL: byte-level),
 * splitting with data.tokenizer_pattern unless that is auto. */
static int load_ckpt_tokenizer(const char *dir, const loco_config *cfg, loco_tok **t) {
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    LOCO_CHECK(loco_tok_load_optional(t, path, (int)cfg->model.vocab_size));
    int rc = *t ? loco_tok_set_pattern(*t, cfg->data.tokenizer_pattern) : 0;
    if (rc < 0) {
        loco_tok_destroy(*t);
        *t = NULL;
    }
    return rc;
}

int cli_eval(int argc, char **argv) {
    const char *config = NULL, *ckpt = NULL;
    long long batches = 20;
    char *sets[MAX_SETS];
    int nsets = 0;
    for (int i = 0; i < argc; i++) {
        if (!strcmp(argv[i], "--set") && i + 1 < argc && nsets < MAX_SETS)
            sets[nsets++] = argv[++i];
        else if (!strcmp(argv[i], "--ckpt") && i + 1 < argc)
            ckpt = argv[++i];
        else if (!strcmp(argv[i], "--batches") && i + 1 < argc) {
            if (!parse_count(argv[++i], 1, 1000000000, &batches))
                return usage_error("eval", "--batches expects a positive integer", argv[i]);
        } else if (argv[i][0] != '-' && !config)
            config = argv[i];
        else
            return usage_error("eval", "unexpected argument", argv[i]);
    }
    if (!config || !ckpt)
        return usage_error("eval", "expected CONFIG and --ckpt DIR", NULL);
    loco_config cfg;
    int rc = cli_load_config(&cfg, config, nsets, sets);
    if (rc < 0)
        return cli_fail(rc);
    loco_set_threads((int)cfg.run.threads);
    const int B = (int)cfg.train.batch_size, T = (int)cfg.model.seq_len;
    const int V = (int)cfg.model.vocab_size;
    loco_gpt *m = NULL;
    rc = loco_ckpt_load_model(&m, ckpt, &cfg, B, T);
    if (rc < 0)
        return cli_fail(rc);
    loco_data *val = NULL;
    loco_tok *tok = NULL;
    uint32_t *tbytes = NULL; /* text bytes of each id (NULL: one, byte-level) */
    loco_eval_result r;
    rc = load_ckpt_tokenizer(ckpt, &cfg, &tok);
    if (rc == 0 && tok && !(tbytes = loco_alloc((size_t)V * sizeof *tbytes)))
        rc = LOCO_ERR(LOCO_ENOMEM, "eval: %d token lengths", V);
    if (rc == 0 && tok)
        rc = loco_tok_text_bytes(tok, V, tbytes);
    if (rc == 0)
        rc = loco_data_open(&val, cfg.data.val, B, T, 0, 1, V);
    if (rc == 0)
        rc = loco_gpt_eval(m, val, batches, tbytes, &r);
    /* nats per byte: comparable across vocabularies (bytes are the
     * byte-level model's tokens) */
    if (rc == 0 && (tok || V <= 256))
        printf("{\"val_loss\": %.6f, \"tokens\": %lld, \"bytes\": %lld, \"nats_per_byte\": "
               "%.6f}\n",
               r.loss, r.tokens, r.bytes, r.nats_per_byte);
    else if (rc == 0)
        printf("{\"val_loss\": %.6f, \"tokens\": %lld}\n", r.loss, r.tokens);
    loco_tok_destroy(tok);
    loco_free(tbytes);
    loco_data_close(val);
    loco_gpt_destroy(m);
    return rc < 0 ? cli_fail(rc) : CLI_OK;
}

/* Prints each sampled id as text: its bytes with a tokenizer, the byte
 * itself for a byte-level model, else " ID". */
typedef struct {
    const loco_tok *tok;
    int V;
} sample_out;

static int print_token(int id, void *arg) {
    const sample_out *o = arg;
    size_t blen;
    const uint8_t *b = o->tok ? loco_tok_token_bytes(o->tok, id, &blen) : NULL;
    if (o->tok && b)
        fwrite(b, 1, blen, stdout);
    else if (o->V <= 256)
        putchar(id);
    else
        printf(" %d", id);
    fflush(stdout);
    return 0;
}

int cli_sample(int argc, char **argv) {
    const char *ckpt = NULL, *prompt = "";
    long long ntok = 256, top_k = 0, seed = 1337;
    double temperature = 1.0;
    for (int i = 0; i < argc; i++) {
        if (!strcmp(argv[i], "--ckpt") && i + 1 < argc)
            ckpt = argv[++i];
        else if (!strcmp(argv[i], "--prompt") && i + 1 < argc)
            prompt = argv[++i];
        else if (!strcmp(argv[i], "--tokens") && i + 1 < argc) {
            if (!parse_count(argv[++i], 1, 100000000, &ntok))
                return usage_error("sample", "--tokens expects a positive integer", argv[i]);
        } else if (!strcmp(argv[i], "--top-k") && i + 1 < argc) {
            if (!parse_count(argv[++i], 0, 100000000, &top_k))
                return usage_error("sample", "--top-k expects an integer >= 0", argv[i]);
        } else if (!strcmp(argv[i], "--seed") && i + 1 < argc) {
            if (!parse_count(argv[++i], 0, LLONG_MAX, &seed))
                return usage_error("sample", "--seed expects an integer >= 0", argv[i]);
        } else if (!strcmp(argv[i], "--temperature") && i + 1 < argc) {
            char *end;
            temperature = strtod(argv[++i], &end);
            if (*end || !(temperature > 0) || !isfinite(temperature))
                return usage_error("sample", "--temperature expects a number > 0", argv[i]);
        } else
            return usage_error("sample", "unexpected argument", argv[i]);
    }
    if (!ckpt)
        return usage_error("sample", "missing --ckpt DIR", NULL);
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s/config.ini", ckpt);
    loco_config cfg;
    int rc = cli_load_config(&cfg, path, 0, NULL);
    if (rc < 0)
        return cli_fail(rc);
    loco_set_threads((int)cfg.run.threads);
    const int T = (int)cfg.model.seq_len, V = (int)cfg.model.vocab_size;
    loco_gpt *m = NULL;
    rc = loco_ckpt_load_model(&m, ckpt, &cfg, 1, T);
    if (rc < 0)
        return cli_fail(rc);
    size_t plen = strlen(prompt);
    size_t cap = plen + (size_t)ntok + 1;
    int32_t *ctx = loco_alloc(cap * sizeof(int32_t));
    loco_tok *tok = NULL;
    if (!ctx) {
        rc = LOCO_ERR(LOCO_ENOMEM, "sampling buffers");
        goto out;
    }
    /* The checkpoint's BPE (tokenizer.json) when it has one, else bytes. */
    LOCO_CHECK_GOTO(load_ckpt_tokenizer(ckpt, &cfg, &tok), out);
    size_t n = 0;
    if (tok) {
        int32_t *pids;
        LOCO_CHECK_GOTO(loco_tok_encode(tok, (const uint8_t *)prompt, plen, &pids, &n), out);
        memcpy(ctx, pids, n * sizeof *ctx);
        loco_free(pids);
        if (n == 0 && loco_tok_eot_id(tok) >= 0)
            ctx[n++] = loco_tok_eot_id(tok);
    } else {
        for (size_t i = 0; i < plen; i++)
            ctx[n++] = (unsigned char)prompt[i] % V;
    }
    if (n == 0)
        ctx[n++] = '\n' % V;
    loco_rng rng;
    loco_rng_seed(&rng, (uint64_t)seed);
    fwrite(prompt, 1, plen, stdout);
    const loco_sample_opts so = {.temperature = (float)temperature, .top_k = (int)top_k};
    sample_out po = {.tok = tok, .V = V};
    LOCO_CHECK_GOTO(loco_gpt_generate(m, ctx, &n, cap, ntok, &so, &rng, print_token, &po), out);
    putchar('\n');
out:
    loco_tok_destroy(tok);
    loco_free(ctx);
    loco_gpt_destroy(m);
    return rc < 0 ? cli_fail(rc) : CLI_OK;
}

static void prep_progress(size_t done, size_t total, void *arg) {
    double dt = loco_now() - *(const double *)arg;
    fprintf(stderr, "\rprep: encoded %.1f / %.1f MB (%.1f MB/s)", (double)done / 1e6,
            (double)total / 1e6, dt > 0 ? (double)done / 1e6 / dt : 0.0);
    if (done == total)
        fputc('\n', stderr);
}

/* BPE ids of the text (one document, <|endoftext|> before it, as llm.c's
 * preparation scripts put one before every document; the text's own
 * <|endoftext|> markers separate further documents) into shards, and the
 * tokenizer beside them as PREFIX_tokenizer.json. */
static int prep_bpe(const char *text, const char *prefix, const char *spec, const char *pattern,
                    double val_frac, size_t shard_tokens) {
    loco_tok *t;
    LOCO_CHECK(loco_tok_load_pattern(&t, spec, pattern));
    uint8_t *data = NULL;
    int32_t *ids = NULL;
    size_t len = 0, n = 0;
    int rc = 0;
    LOCO_CHECK_GOTO(loco_file_read(text, (void **)&data, &len), out);
    double t0 = loco_now();
    LOCO_CHECK_GOTO(loco_tok_encode_document(t, spec, data, len, 1 << 20, 0, prep_progress, &t0,
                                             &ids, &n),
                    out);
    fprintf(stderr, "prep: %s: %zu bytes -> %zu ids (%.3f bytes/id) in %.2f s\n", text, len,
            n - 1, n > 1 ? (double)len / (double)(n - 1) : 0.0, loco_now() - t0);
    LOCO_CHECK_GOTO(loco_data_prep_tokens(ids, n, loco_tok_vocab_size(t), text, prefix, val_frac,
                                          shard_tokens),
                    out);
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s_tokenizer.json", prefix);
    LOCO_CHECK_GOTO(loco_tok_save_hf(t, path), out);
    fprintf(stderr, "prep: wrote %s; train with data.tokenizer = %s and model.vocab_size >= %d\n",
            path, path, loco_tok_vocab_size(t));
out:
    loco_free(ids);
    loco_free(data);
    loco_tok_destroy(t);
    return rc;
}

int cli_prep(int argc, char **argv) {
    const char *text = NULL, *prefix = NULL, *tokenizer = NULL, *pattern = NULL;
    double val_frac = 0.1;
    long long shard_tokens = 1 << 20;
    for (int i = 0; i < argc; i++) {
        if (!strcmp(argv[i], "--val-frac") && i + 1 < argc) {
            char *end;
            val_frac = strtod(argv[++i], &end);
            if (*end || !(val_frac > 0 && val_frac < 1))
                return usage_error("prep", "--val-frac expects a number in (0, 1)", argv[i]);
        } else if (!strcmp(argv[i], "--shard-tokens") && i + 1 < argc) {
            if (!parse_count(argv[++i], 1024, 1LL << 40, &shard_tokens))
                return usage_error("prep", "--shard-tokens expects an integer >= 1024", argv[i]);
        } else if (!strcmp(argv[i], "--tokenizer") && i + 1 < argc) {
            tokenizer = argv[++i];
        } else if (!strcmp(argv[i], "--pattern") && i + 1 < argc) {
            pattern = argv[++i];
        } else if (argv[i][0] != '-' && !text)
            text = argv[i];
        else if (argv[i][0] != '-' && !prefix)
            prefix = argv[i];
        else
            return usage_error("prep", "unexpected argument", argv[i]);
    }
    if (!text || !prefix)
        return usage_error("prep", "expected TEXT OUT_PREFIX", NULL);
    if (pattern && !tokenizer)
        return usage_error("prep", "--pattern needs --tokenizer FILE (bytes have no pattern)",
                           pattern);
    int rc = tokenizer ? prep_bpe(text, prefix, tokenizer, pattern, val_frac, (size_t)shard_tokens)
                       : loco_data_prep_bytes(text, prefix, val_frac, (size_t)shard_tokens);
    return rc < 0 ? cli_fail(rc) : CLI_OK;
}

int cli_config(int argc, char **argv) {
    if (argc >= 1 && !strcmp(argv[0], "--help")) {
        printf("loco configuration keys (INI [section] key = value, or --set "
               "section.key=value):\n");
        loco_config_print_help(stdout);
        return CLI_OK;
    }
    if (argc >= 1 && !strcmp(argv[0], "--markdown")) {
        loco_config_print_markdown(stdout);
        return CLI_OK;
    }
    if (argc >= 1 && !strcmp(argv[0], "--dump")) {
        const char *config = NULL;
        char *sets[MAX_SETS];
        int nsets = 0;
        for (int i = 1; i < argc; i++) {
            if (!strcmp(argv[i], "--set") && i + 1 < argc && nsets < MAX_SETS)
                sets[nsets++] = argv[++i];
            else if (argv[i][0] != '-' && !config)
                config = argv[i];
            else
                return usage_error("config", "unexpected argument", argv[i]);
        }
        loco_config cfg;
        int rc = cli_load_config(&cfg, config, nsets, sets);
        if (rc < 0)
            return cli_fail(rc);
        loco_config_dump(&cfg, stdout);
        return CLI_OK;
    }
    return usage_error("config", "expected --help, --markdown or --dump [CONFIG]", NULL);
}

int cli_bench(int argc, char **argv) {
    if (argc < 1)
        return usage_error("bench", "expected a benchmark name (step, memory, exchange, compress, rejoin, pipeline, tokenizer)", NULL);
    int rc;
    if (!strcmp(argv[0], "step"))
        rc = loco_bench_step(argc - 1, argv + 1);
    else if (!strcmp(argv[0], "memory"))
        rc = loco_bench_memory(argc - 1, argv + 1);
    else if (!strcmp(argv[0], "exchange"))
        rc = loco_bench_exchange(argc - 1, argv + 1);
    else if (!strcmp(argv[0], "compress"))
        rc = loco_bench_compress(argc - 1, argv + 1);
    else if (!strcmp(argv[0], "rejoin"))
        rc = loco_bench_rejoin(argc - 1, argv + 1);
    else if (!strcmp(argv[0], "pipeline"))
        rc = loco_bench_pipeline(argc - 1, argv + 1);
    else if (!strcmp(argv[0], "tokenizer"))
        rc = loco_bench_tokenizer(argc - 1, argv + 1);
    else
        return usage_error("bench", "unknown benchmark (step, memory, exchange, compress, rejoin, pipeline, tokenizer)",
                           argv[0]);
    return rc < 0 ? cli_fail(rc) : CLI_OK;
}

int cli_ckpt(int argc, char **argv) {
    if (argc == 3 && !strcmp(argv[0], "export")) {
        int rc = loco_ckpt_export(argv[1], argv[2]);
        if (rc < 0)
            return cli_fail(rc);
        printf("wrote %s/model.safetensors and %s/config.json\n", argv[2], argv[2]);
        return CLI_OK;
    }
    return usage_error("ckpt", "expected: ckpt export CKPT_DIR OUT_DIR", NULL);
}
