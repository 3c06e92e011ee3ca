/* `loco island CONFIG --site NAME`: one island of a multi-site run. Its
 * ranks train as `loco train` would; between inner steps the island's
 * outer loop (outer/: DiLoCo or Streaming DiLoCo with the same rank of
 * every other island, the coordinator, rejoin, outer-state checkpoints)
 * does what is due. */
#include "cli/cli.h"

#include "inner/ckpt/ckpt.h"
#include "inner/comm/comm.h"
#include "inner/train/train.h"
#include "outer/outer.h"

#include <limits.h>
#include <stdlib.h>
#include <string.h>

#define MAX_SETS 256

/* What outer/ sees of the trainer. */
static float *owned(void *t, size_t *lo, size_t *hi) {
    return loco_trainer_owned_params(t, lo, hi);
}
static const loco_ttable *table(void *t) { return loco_trainer_param_table(t); }
static int sync_params(void *t) { return loco_trainer_sync_params(t); }
static void set_step(void *t, int64_t step) { loco_trainer_set_step(t, step); }
static int64_t steps_done(void *t) { return loco_trainer_steps_done(t); }
static void set_schedule(void *t, int64_t step) { loco_trainer_set_schedule_step(t, step); }
static float *device_owned(void *t, size_t *lo, size_t *hi) {
    return loco_trainer_device_params(t, lo, hi);
}
static int device_written(void *t) { return loco_trainer_device_written(t); }
static uint64_t take_pcie_bytes(void *t) { return loco_trainer_take_pcie_bytes(t); }
static int whole_layout(void *t, loco_ttable *whole, int64_t *idx) {
    return loco_trainer_whole_layout(t, whole, idx);
}

/* --resume: the newest checkpoint that verifies. With none, the island
 * starts afresh (*resume NULL) and joins as a new island would: its outer
 * loop finds its committed step behind and fetches θ_global. */
static int pick_resume(const char **resume, char *ck, size_t cap) {
    if (!*resume)
        return 0;
    const int rc = loco_ckpt_pick_resume(*resume, ck, cap);
    if (rc < 0 && rc != LOCO_EPROTO)
        return rc;
    if (rc < 0)
        loco_warn("resume: %s; this island starts afresh and joins the run by state transfer",
                  loco_errmsg());
    *resume = rc < 0 ? NULL : ck;
    return 0;
}

static int run_island(const loco_config *c, const char *site, const char *resume, loco_trainer **t,
                      loco_island **is, cli_metrics **metrics) {
    int id, K;
    char ck[PATH_MAX];
    LOCO_CHECK(loco_site_id(c, site, &id, &K));
    LOCO_CHECK(pick_resume(&resume, ck, sizeof ck));
    LOCO_CHECK(loco_trainer_create_island(t, c, resume, id, K));
    LOCO_CHECK(cli_metrics_serve_run(metrics, loco_trainer_prom(*t), c->run.metrics_addr,
                                     "run.metrics_addr", c->run.dir));
    const loco_inner_view view = {.ctx = *t, .owned = owned, .table = table,
                                  .sync = sync_params, .set_step = set_step, .set_schedule = set_schedule,
                                  .steps_done = steps_done, .device_owned = device_owned,
                                  .device_written = device_written,
                                  .take_pcie_bytes = take_pcie_bytes,
                                  .whole_layout = whole_layout};
    LOCO_CHECK(loco_island_create(is, c, site, loco_trainer_world(*t), &view, resume != NULL));
    LOCO_CHECK(loco_trainer_begin_run(*t));
    LOCO_CHECK(loco_island_set_prom(*is, loco_trainer_prom(*t)));
    while (!loco_island_finished(*is) && loco_trainer_steps_done(*t) < loco_island_end_step(*is)) {
        loco_step_stats s;
        double t0 = loco_now();
        LOCO_CHECK(loco_trainer_step(*t, &s));
        LOCO_CHECK(loco_island_after_step(*is, s.step, loco_now() - t0));
        /* the end as the coordinator holds it (a fault lab's open cycle) */
        loco_trainer_set_end(*t, loco_island_end_step(*is));
        LOCO_CHECK(loco_trainer_after_step(*t, &s));
        /* With each inner checkpoint, the outer state of the same step. */
        const bool last = s.step == loco_island_end_step(*is);
        if ((c->run.ckpt_every > 0 && s.step % c->run.ckpt_every == 0) || last)
            LOCO_CHECK(loco_island_save(*is, s.step));
    }
    return loco_island_leave(*is);
}

int cli_island(int argc, char **argv) {
    const char *config = NULL, *resume = NULL, *site = NULL;
    char *sets[MAX_SETS];
    int nsets = 0;
    for (int i = 0; i < argc; i++) {
        if (!strcmp(argv[i], "--set") && i + 1 < argc && nsets < MAX_SETS)
            sets[nsets++] = argv[++i];
        else if (!strcmp(argv[i], "--site") && i + 1 < argc)
            site = argv[++i];
        else if (!strcmp(argv[i], "--resume") && i + 1 < argc)
            resume = argv[++i];
        else if (argv[i][0] != '-' && !config)
            config = argv[i];
        else {
            fprintf(stderr, "loco island: unexpected argument: %s\n", argv[i]);
            return CLI_USAGE;
        }
    }
    if (!config || !site) {
        fprintf(stderr, "loco island: expected CONFIG and --site NAME\n");
        return CLI_USAGE;
    }
    loco_config cfg;
    loco_trainer *t = NULL;
    loco_island *is = NULL;
    cli_metrics *metrics = NULL;
    int rc = cli_load_config(&cfg, config, nsets, sets);
    if (rc == 0) /* its [site.NAME] keys, then checked again as this island's */
        rc = loco_config_for_site(&cfg, site);
    if (rc == 0)
        rc = loco_config_validate(&cfg);
    if (rc == 0)
        rc = run_island(&cfg, site, resume, &t, &is, &metrics);
    if (rc < 0) {
        cli_fail(rc);
        /* A failed rank must not leave the others waiting in a collective. */
        struct loco_comm *world = t ? loco_trainer_world(t) : NULL;
        if (world && loco_comm_size(world) > 1)
            loco_comm_abort(world, CLI_FAIL);
    }
    cli_metrics_stop(metrics); /* before the registry it serves goes */
    loco_island_destroy(is);
    loco_trainer_destroy(t);
    return rc < 0 ? CLI_FAIL : CLI_OK;
}
