/* cli/ — the `loco` program. Only this room prints errors and exits. */
#ifndef LOCO_CLI_H
#define LOCO_CLI_H

#include "core/core.h"

/* Exit statuses of every subcommand. */
enum { CLI_OK = 0, CLI_FAIL = 1, CLI_USAGE = 2 };

/* Prints "loco: error: <this thread's message>" for status rc and returns
 * CLI_FAIL (CLI_USAGE for LOCO_EINVAL from option parsing is the caller's). */
int cli_fail(int rc);

/* Loads defaults, the INI file (if not NULL), then each --set in order,
 * validates, and applies run.log_level. */
int cli_load_config(loco_config *cfg, const char *path, int nsets, char **sets);

int cli_train(int argc, char **argv);
int cli_eval(int argc, char **argv);
int cli_sample(int argc, char **argv);
int cli_prep(int argc, char **argv);
int cli_config(int argc, char **argv);
int cli_bench(int argc, char **argv);
int cli_ckpt(int argc, char **argv);
int cli_island(int argc, char **argv);
int cli_coordinator(int argc, char **argv);
int cli_certs(int argc, char **argv);
int cli_launch(int argc, char **argv);
int cli_report(int argc, char **argv);
int cli_pipeline(int argc, char **argv);

/* Options of a fault-experiment report (docs/REPORTS.md). */
typedef struct {
    double loss_tol;  /* relative final-loss difference still "within" (0.01 = 1%) */
    bool strict_loss; /* a final loss outside loss_tol fails the verdict */
} cli_report_opts;

void cli_report_opts_default(cli_report_opts *o);

/* Writes report.md and report.html into out_dir (NULL: fault_dir, created
 * when missing) for the fault run in fault_dir against the fault-free run in
 * baseline_dir, prints their paths and the verdict line on stdout, and sets
 * *verdict_ok (may be NULL) to 1 for PASS, 0 for FAIL. Malformed lines are
 * warned about (file:line) and skipped. Returns 0, or a negative LOCO_E*
 * code with the message recorded (a missing run directory, events.jsonl or
 * metrics.jsonl names the path); *verdict_ok is then untouched. opts NULL =
 * defaults; cli_write_report is the same with the defaults. */
int cli_write_report_opts(const char *fault_dir, const char *baseline_dir, const char *out_dir,
                          const cli_report_opts *opts, int *verdict_ok);
int cli_write_report(const char *fault_dir, const char *baseline_dir, const char *out_dir,
                     int *verdict_ok);

#endif /* LOCO_CLI_H */
