/* Pre-tokenisation patterns: the named ones (gpt2, cl100k, o200k, llama3),
 * a tokenizer.json's own Split regex, and their compilation for PCRE2 with
 * the meaning tiktoken (Rust's fancy-regex) and Hugging Face give them. */
#include "tokenizer/internal.h"

#include <cjson/cJSON.h>
#include <string.h>

static const tok_pattern patterns[] = {
    {"gpt2", LOCO_TOK_GPT2_PATTERN, 0, 0, {{NULL, 0}}},
    {"cl100k",
     LOCO_TOK_CL100K_PATTERN,
     100256,
     0,
     {{"<|endoftext|>", 100257},
      {"<|fim_prefix|>", 100258},
      {"<|fim_middle|>", 100259},
      {"<|fim_suffix|>", 100260},
      {"<|endofprompt|>", 100276}}},
    {"o200k",
     LOCO_TOK_O200K_PATTERN,
     199998,
     0,
     {{"<|endoftext|>", 199999}, {"<|endofprompt|>", 200018}}},
    /* Llama 3.1's tokenizer.model: 256 specials after 128000 ranks, 248 of
     * them reserved, as the added_tokens of Meta-Llama-3.1-8B's
     * tokenizer.json (meta-llama/llama-models' tokenizer.py has <|step_id|>
     * at 128005, so its reserved ones from 128011 are numbered one lower) */
    {"llama3",
     LOCO_TOK_LLAMA3_PATTERN,
     128000,
     128256,
     {{"<|begin_of_text|>", 128000},
      {"<|end_of_text|>", 128001},
      {"<|finetune_right_pad_id|>", 128004},
      {"<|start_header_id|>", 128006},
      {"<|end_header_id|>", 128007},
      {"<|eom_id|>", 128008},
      {"<|eot_id|>", 128009},
      {"<|python_tag|>", 128010}}},
};
#define NPATTERNS (sizeof patterns / sizeof patterns[0])

const tok_pattern *loco__tok_pattern(const char *name) {
    for (size_t i = 0; name && i < NPATTERNS; i++)
        if (!strcmp(patterns[i].name, name))
            return &patterns[i];
    return NULL;
}

const char *loco_tok_pattern_regex(const char *name) {
    const tok_pattern *p = loco__tok_pattern(name);
    return p ? p->regex : NULL;
}

int loco__tok_pattern_auto(const char *name) {
    return !name || !name[0] || !strcmp(name, "auto");
}

int loco__tok_pattern_check(const char *name, const char *what) {
    if (loco__tok_pattern_auto(name) || loco__tok_pattern(name))
        return 0;
    return LOCO_ERR(LOCO_EINVAL, "%s: unknown pre-tokenizer pattern \"%s\" (expected auto, %s)",
                    what, name, LOCO_TOK_PATTERN_NAMES);
}

int loco__tok_use_regex(loco_tok *t, const char *regex, const char *what) {
    size_t n = strlen(regex);
    char *copy = loco_alloc(n + 1);
    if (!copy)
        return LOCO_ERR(LOCO_ENOMEM, "%s: out of memory for the pre-tokenizer regex", what);
    memcpy(copy, regex, n + 1);
    int err;
    PCRE2_SIZE erroff;
    /* $ is the end of the text only, as in Rust's regex (GPT-2's pattern has
     * no $: it compiles as it always did) */
    pcre2_code *re = pcre2_compile((PCRE2_SPTR)regex, PCRE2_ZERO_TERMINATED,
                                   PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF |
                                       PCRE2_NO_UTF_CHECK | PCRE2_DOLLAR_ENDONLY,
                                   &err, &erroff, NULL);
    if (!re) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(err, msg, sizeof msg);
        loco_free(copy);
        return LOCO_ERR(LOCO_EPROTO,
                        "%s: tokenizer regex \"%.80s\": PCRE2 compile error at %zu: %s", what,
                        regex, (size_t)erroff, (const char *)msg);
    }
    if (t->re)
        pcre2_code_free(t->re);
    loco_free(t->regex);
    t->re = re;
    t->jit = pcre2_jit_compile(t->re, PCRE2_JIT_COMPLETE) == 0; /* else the interpreter */
    t->regex = copy;
    t->pattern_name = "custom";
    for (size_t i = 0; i < NPATTERNS; i++)
        if (!strcmp(patterns[i].regex, regex))
            t->pattern_name = patterns[i].name;
    return 0;
}

int loco_tok_set_pattern(loco_tok *t, const char *name) {
    LOCO_CHECK(loco__tok_pattern_check(name, "tokenizer"));
    if (loco__tok_pattern_auto(name))
        return 0;
    return loco__tok_use_regex(t, loco__tok_pattern(name)->regex, name);
}

const char *loco_tok_pattern_name(const loco_tok *t) {
    return t->pattern_name ? t->pattern_name : "gpt2";
}

int loco__tok_chunkable(const loco_tok *t) {
    return strcmp(loco_tok_pattern_name(t), "custom") != 0;
}

/* ------------------------------------------------------------ tokenizer.json */

static int json_flag(const cJSON *o, const char *key, int dflt) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    return cJSON_IsBool(v) ? cJSON_IsTrue(v) : dflt;
}

/* One pre-tokenizer of a tokenizer.json: a Split adds its regex, a ByteLevel
 * with use_regex GPT-2's; *nsplit counts them. */
static int hf_one(const char *path, const char *where, const cJSON *pt, const char **regex,
                  int *nsplit) {
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(pt, "type");
    const char *ty = cJSON_IsString(type) ? type->valuestring : "";
    if (!strcmp(ty, "ByteLevel")) {
        if (json_flag(pt, "add_prefix_space", 0))
            return LOCO_ERR(LOCO_EPROTO,
                            "%s: %s: ByteLevel add_prefix_space true is not supported (loco "
                            "adds no space before the text)",
                            path, where);
        if (json_flag(pt, "use_regex", 1)) {
            *regex = LOCO_TOK_GPT2_PATTERN;
            ++*nsplit;
        }
        return 0;
    }
    if (!strcmp(ty, "Split")) {
        const cJSON *pat = cJSON_GetObjectItemCaseSensitive(pt, "pattern");
        const cJSON *re = cJSON_GetObjectItemCaseSensitive(pat, "Regex");
        const cJSON *beh = cJSON_GetObjectItemCaseSensitive(pt, "behavior");
        if (!cJSON_IsString(re) || !re->valuestring[0])
            return LOCO_ERR(LOCO_EPROTO,
                            "%s: %s: Split: expected \"pattern\": {\"Regex\": \"...\"} (a String "
                            "pattern is not supported)",
                            path, where);
        if (!cJSON_IsString(beh) || strcmp(beh->valuestring, "Isolated") ||
            json_flag(pt, "invert", 0))
            return LOCO_ERR(LOCO_EPROTO,
                            "%s: %s: Split: only behavior \"Isolated\" with invert false is "
                            "supported (every match a piece)",
                            path, where);
        *regex = re->valuestring;
        ++*nsplit;
        return 0;
    }
    return LOCO_ERR(LOCO_EPROTO,
                    "%s: %s: pre-tokenizer type \"%.40s\" is not supported (expected ByteLevel, "
                    "Split or a Sequence of them)",
                    path, where, ty);
}

int loco__tok_hf_pre_tokenizer(const char *path, const cJSON *pre, const char **regex) {
    *regex = LOCO_TOK_GPT2_PATTERN;
    if (!pre || cJSON_IsNull(pre)) /* GPT-2's, as before pre-tokenizers were read */
        return 0;
    if (!cJSON_IsObject(pre))
        return LOCO_ERR(LOCO_EPROTO, "%s: pre_tokenizer: expected an object or null", path);
    int nsplit = 0;
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(pre, "type");
    if (cJSON_IsString(type) && !strcmp(type->valuestring, "Sequence")) {
        const cJSON *list = cJSON_GetObjectItemCaseSensitive(pre, "pretokenizers"), *e;
        if (!cJSON_IsArray(list))
            return LOCO_ERR(LOCO_EPROTO,
                            "%s: pre_tokenizer: Sequence without a pretokenizers array", path);
        int i = 0;
        cJSON_ArrayForEach(e, list) {
            char where[64];
            snprintf(where, sizeof where, "pre_tokenizer.pretokenizers[%d]", i++);
            LOCO_CHECK(hf_one(path, where, e, regex, &nsplit));
        }
    } else {
        LOCO_CHECK(hf_one(path, "pre_tokenizer", pre, regex, &nsplit));
    }
    if (nsplit == 0)
        return LOCO_ERR(LOCO_EPROTO,
                        "%s: pre_tokenizer: no regex (ByteLevel use_regex false and no Split): "
                        "the whole text as one piece is not supported",
                        path);
    if (nsplit > 1)
        return LOCO_ERR(
            LOCO_EPROTO,
            "%s: pre_tokenizer: %d regex splits (Split, ByteLevel use_regex true); loco "
            "applies exactly one",
            path, nsplit);
    return 0;
}

static cJSON *byte_level(int use_regex) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "type", "ByteLevel");
    cJSON_AddBoolToObject(o, "add_prefix_space", 0);
    cJSON_AddBoolToObject(o, "trim_offsets", 1);
    cJSON_AddBoolToObject(o, "use_regex", use_regex);
    return o;
}

cJSON *loco__tok_hf_pre_tokenizer_json(const loco_tok *t) {
    if (!t->regex || !strcmp(t->regex, LOCO_TOK_GPT2_PATTERN))
        return byte_level(1);
    cJSON *seq = cJSON_CreateObject();
    cJSON_AddStringToObject(seq, "type", "Sequence");
    cJSON *list = cJSON_AddArrayToObject(seq, "pretokenizers");
    cJSON *split = cJSON_CreateObject();
    cJSON_AddStringToObject(split, "type", "Split");
    cJSON_AddStringToObject(cJSON_AddObjectToObject(split, "pattern"), "Regex", t->regex);
    cJSON_AddStringToObject(split, "behavior", "Isolated");
    cJSON_AddBoolToObject(split, "invert", 0);
    cJSON_AddItemToArray(list, split);
    cJSON_AddItemToArray(list, byte_level(0));
    return seq;
}
