/* `loco report FAULT_RUN BASELINE_RUN [--out DIR] [--loss-tol X]
 * [--strict-loss]`: the arguments; the report itself is faulttol/'s
 * (loco_report_write_opts, docs/REPORTS.md). */
#include "cli/cli.h"
#include "faulttol/faulttol.h"

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
        } else if (!strcmp(argv[i], "--strict-loss")) {
            o.strict_loss = true;
        } else if (argv[i][0] != '-' && ndirs < 2) {
            dirs[ndirs++] = argv[i];
        } else {
            return report_usage("unexpected argument", argv[i]);
        }
    }
    if (ndirs != 2)
        return report_usage("expected FAULT_RUN_DIR BASELINE_RUN_DIR", NULL);
    int ok = 0;
    int rc = loco_report_write_opts(dirs[0], dirs[1], out, &o, &ok);
    if (rc < 0)
        return cli_fail(rc);
    return ok ? CLI_OK : CLI_FAIL;
}
