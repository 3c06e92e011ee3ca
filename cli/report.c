/* `loco report FAULT_RUN BASELINE_RUN [--out DIR] [--loss-tol X]
 * [--strict-loss]` and `loco report RUN_DIR [--out DIR]`: the arguments,
 * and which report a lone RUN_DIR gets (a training run's, or a fault
 * experiment's against RUN_DIR/baseline); the reports themselves are
 * report/'s (loco_report_write_opts, loco_report_train_write,
 * docs/REPORTS.md). */
#include "cli/cli.h"
#include "report/report.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int report_usage(const char *msg, const char *arg) {
    fprintf(stderr, "loco report: %s%s%s\n(run `loco help` for usage)\n", msg, arg ? ": " : "",
            arg ? arg : "");
    return CLI_USAGE;
}

int cli_report(int argc, char **argv) {
    const char *dirs[2] = {NULL, NULL}, *out = NULL;
    int ndirs = 0;
    bool fault_opts = false;
    loco_report_opts o;
    loco_report_opts_default(&o);
    for (int i = 0; i < argc; i++) {
        if (!strcmp(argv[i], "--out") && i + 1 < argc) {
            out = argv[++i];
        } else if (!strcmp(argv[i], "--loss-tol") && i + 1 < argc) {
            char *end;
            o.loss_tol = strtod(argv[++i], &end);
            if (end == argv[i] || *end || !(o.loss_tol >= 0) || !isfinite(o.loss_tol))
                return report_usage("--loss-tol expects a non-negative number", argv[i]);
            fault_opts = true;
        } else if (!strcmp(argv[i], "--strict-loss")) {
            o.strict_loss = fault_opts = true;
        } else if (argv[i][0] != '-' && ndirs < 2) {
            dirs[ndirs++] = argv[i];
        } else {
            return report_usage("unexpected argument", argv[i]);
        }
    }
    if (ndirs == 0)
        return report_usage("expected RUN_DIR, or FAULT_RUN_DIR BASELINE_RUN_DIR", NULL);
    char baseline[LOCO_PATH_MAX + 16];
    if (ndirs == 1) {
        loco_rundir_kind kind;
        int rc = loco_report_kind(dirs[0], &kind, baseline, sizeof baseline);
        if (rc < 0)
            return cli_fail(rc);
        if (kind != LOCO_RUNDIR_FAULT) {
            if (fault_opts)
                return report_usage("--loss-tol and --strict-loss apply to fault experiments only",
                                    dirs[0]);
            rc = loco_report_train_write(dirs[0], out);
            return rc < 0 ? cli_fail(rc) : CLI_OK;
        }
        dirs[1] = baseline;
    }
    int ok = 0;
    int rc = loco_report_write_opts(dirs[0], dirs[1], out, &o, &ok);
    if (rc < 0)
        return cli_fail(rc);
    return ok ? CLI_OK : CLI_FAIL;
}
