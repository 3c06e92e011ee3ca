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
int cli_lab(int argc, char **argv);

/* ------------------------------------------------- metrics over HTTP
 * cli/metrics_http.c: a registry the library keeps (loco_prom: the
 * trainer's, the coordinator's) served on GET /metrics by a thread of
 * GNU libmicrohttpd; 404 elsewhere, 405 for other methods. */
typedef struct cli_metrics cli_metrics;

/* What a scraper may take of the process: connections at once (more are
 * refused by the library), seconds an idle or slow connection is kept,
 * bytes of request a connection may hold, queued connections. */
#define CLI_METRICS_MAX_CONNECTIONS 16
#define CLI_METRICS_TIMEOUT_S 10
#define CLI_METRICS_CONN_MEMORY (32 * 1024)
#define CLI_METRICS_BACKLOG 16

/* Serves p on addr "HOST:PORT" ("[v6]:PORT"; port 0: a free one), bound
 * to that host only; p must outlive the server. `what` names the setting
 * in errors ("faulttol.metrics_addr"). When port_file is not NULL,
 * "HOST:PORT\n" with the port bound is written there (atomically) for
 * scrapers to find, and removed by cli_metrics_stop. LOCO_EINVAL on a
 * malformed address, LOCO_EIO when it cannot listen there. */
int cli_metrics_serve(cli_metrics **out, loco_prom *p, const char *addr, const char *what,
                      const char *port_file);
/* The same for a run: nothing (*out NULL) when p is NULL or addr empty
 * (metrics off, or a rank that does not serve), else the port file is
 * RUN_DIR/metrics_addr (run_dir created when missing). */
int cli_metrics_serve_run(cli_metrics **out, loco_prom *p, const char *addr, const char *what,
                          const char *run_dir);
/* The port served; 0 for NULL. */
int cli_metrics_port(const cli_metrics *m);
/* Connections the server holds open now (0 for NULL). */
int cli_metrics_connections(const cli_metrics *m);
/* Stops serving (waits for the library's thread, closes the socket,
 * removes the port file) and frees m. Accepts NULL. */
void cli_metrics_stop(cli_metrics *m);

#endif /* LOCO_CLI_H */
