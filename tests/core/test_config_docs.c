/* The configuration's documentation: docs/CONFIG.md, the Markdown table and
 * the help text kept equal to the key table (core/config_keys.h), every
 * dumped key named in each. */
#include "tests/core/config_test.h"

static char *markdown_text(size_t *len) {
    char *buf = NULL;
    FILE *f = open_memstream(&buf, len);
    cr_assert(f);
    loco_config_print_markdown(f);
    fclose(f);
    return buf;
}

Test(config_docs, docs_config_md_matches_the_table) {
    size_t len;
    char *md = markdown_text(&len);
    void *doc;
    size_t doc_len;
    int rc = loco_file_read("docs/CONFIG.md", &doc, &doc_len);
    cr_assert_eq(rc, 0,
                 "cannot read docs/CONFIG.md (%s); run "
                 "`build/loco config --markdown > docs/CONFIG.md`",
                 loco_errmsg());
    bool same = doc_len == len && memcmp(doc, md, len) == 0;
    loco_free(doc);
    free(md);
    cr_assert(same, "docs/CONFIG.md differs from core/config_keys.h; run "
                    "`build/loco config --markdown > docs/CONFIG.md`");
}

/* Every table row has exactly five cells: a '|' inside a cell (enum choices)
 * must be escaped or the table breaks. */
Test(config_docs, markdown_rows_have_five_cells) {
    size_t len;
    char *md = markdown_text(&len);
    int rows = 0;
    for (char *line = strtok(md, "\n"); line; line = strtok(NULL, "\n")) {
        if (line[0] != '|')
            continue;
        int bars = 0;
        for (char *p = line; *p; p++)
            bars += *p == '|' && (p == line || p[-1] != '\\');
        cr_expect_eq(bars, 6, "row with %d cells: %s", bars - 1, line);
        rows++;
    }
    cr_expect_gt(rows, 19);
    free(md);
}

Test(config_docs, help_names_every_required_key) {
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    cr_assert(f);
    loco_config_print_help(f);
    fclose(f);
    const char *keys[] = {
        "model.n_layer",    "model.n_head",       "model.n_embd",       "model.seq_len",
        "model.vocab_size", "train.batch_size",   "train.grad_accum",   "train.steps",
        "train.lr",         "train.warmup_steps", "train.weight_decay", "train.grad_clip",
        "train.seed",       "data.train",         "data.val",           "run.dir",
        "run.log_every",    "run.eval_every",     "run.ckpt_every"};
    for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++)
        cr_expect(strstr(buf, keys[i]), "help lacks %s", keys[i]);
    free(buf);
}

/* Every key in the dump also appears in the help and in the Markdown. */
Test(config_docs, help_and_markdown_cover_every_dumped_key) {
    loco_config c;
    loco_config_defaults(&c);
    char *text = dump_text(&c);
    char *help = NULL;
    size_t hl = 0;
    FILE *f = open_memstream(&help, &hl);
    cr_assert(f);
    loco_config_print_help(f);
    fclose(f);
    size_t ml;
    char *md = markdown_text(&ml);
    char section[64] = "";
    int n = 0;
    for (char *line = strtok(text, "\n"); line; line = strtok(NULL, "\n")) {
        if (line[0] == '[') {
            snprintf(section, sizeof section, "%.*s", (int)strcspn(line + 1, "]"), line + 1);
            continue;
        }
        char name[160], code[170];
        snprintf(name, sizeof name, "%s.%.*s", section, (int)strcspn(line, " ="), line);
        snprintf(code, sizeof code, "`%s`", name);
        cr_expect(strstr(help, name), "help lacks %s", name);
        cr_expect(strstr(md, code), "markdown lacks %s", code);
        n++;
    }
    cr_expect_gt(n, 19);
    free(md);
    free(help);
    free(text);
}
