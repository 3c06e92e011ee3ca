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
int cli_tokenizer(int argc, char **argv);

#endif /* LOCO_CLI_H */
