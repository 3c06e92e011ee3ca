/* report/: reads the run directories `loco train` and `loco launch` leave
 * (docs/REPORTS.md is the contract) and writes the training report and the
 * fault-experiment report. Calls down only (faulttol's fault cycles, core). */
#ifndef LOCO_REPORT_H
#define LOCO_REPORT_H

#include <stdbool.h>
#include <stddef.h>

/* ------------------------------------------- fault-experiment reports
 * The analysis of a fault run beside a fault-free baseline
 * (report/report*.c; `loco report`, docs/REPORTS.md). */
/* Options of a fault-experiment report (docs/REPORTS.md). */
typedef struct {
    double loss_tol;  /* relative final-loss difference still "within" (0.01 = 1%) */
    bool strict_loss; /* a final loss outside loss_tol fails the verdict */
} loco_report_opts;

void loco_report_opts_default(loco_report_opts *o);

/* Writes report.md and report.html into out_dir (NULL: fault_dir, created
 * when missing) for the fault run in fault_dir against the fault-free run in
 * baseline_dir, prints their paths and the verdict line on stdout, and sets
 * *verdict_ok (may be NULL) to 1 for PASS, 0 for FAIL. Malformed lines are
 * warned about (file:line) and skipped. Returns 0, or a negative LOCO_E*
 * code with the message recorded (a missing run directory, events.jsonl or
 * metrics.jsonl names the path); *verdict_ok is then untouched. opts NULL =
 * defaults; loco_report_write is the same with the defaults. */
int loco_report_write_opts(const char *fault_dir, const char *baseline_dir, const char *out_dir,
                          const loco_report_opts *opts, int *verdict_ok);
int loco_report_write(const char *fault_dir, const char *baseline_dir, const char *out_dir,
                     int *verdict_ok);

/* ------------------------------------------------ training-run reports
 * The report of an ordinary training run (report/report_train.c; `loco
 * report RUN_DIR`, docs/REPORTS.md). */
typedef enum {
    LOCO_RUNDIR_SINGLE = 1, /* `loco train`: RUN/metrics.jsonl */
    LOCO_RUNDIR_MULTI,      /* `loco launch`: RUN/events.jsonl, RUN/<site>/metrics.jsonl */
    LOCO_RUNDIR_FAULT,      /* a fault experiment: a multi-site run with RUN/baseline/ */
} loco_rundir_kind;

/* What run_dir holds. For LOCO_RUNDIR_FAULT, baseline (cap bytes) receives
 * the baseline's directory. LOCO_EIO naming run_dir when it is not a
 * directory or holds none of the files above. */
int loco_report_kind(const char *run_dir, loco_rundir_kind *kind, char *baseline, size_t cap);

/* Writes report.html into out_dir (NULL: run_dir, created when missing) for
 * the single- or multi-site training run in run_dir: loss, validation loss,
 * learning rate, grad norm and tokens/s against step (per island), bytes on
 * the wire and outer steps for a multi-site run, and a summary table; prints
 * its path on stdout. Malformed lines and missing optional files are warned
 * about (file:line) and shown in the page. Returns 0, or a negative LOCO_E*
 * code with the message recorded (a missing or empty metrics.jsonl names
 * the file). */
int loco_report_train_write(const char *run_dir, const char *out_dir);

#endif /* LOCO_REPORT_H */
