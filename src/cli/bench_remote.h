/* bench_remote — the two-host modes of `ect bench xport` and `ect bench push`
 * (see bench_remote.c). */
#ifndef ECT_CLI_BENCH_REMOTE_H
#define ECT_CLI_BENCH_REMOTE_H

#include <stdbool.h>
#include <stddef.h>

#include "cli/cli.h"

/* The two-host flags both benches take, and what they parsed to. */
#define BENCH_REMOTE_OPTIONS                                                                       \
    {"server", no_argument, 0, 'S'}, {"client", required_argument, 0, 'C'},                        \
        {"host", required_argument, 0, 'H'}, {"port", required_argument, 0, 'p'},                  \
        {"data-port", required_argument, 0, 'P'}, {"advertise", required_argument, 0, 'A'}, {      \
        "warmup", required_argument, 0, 'w'                                                        \
    }

typedef struct bench_remote_args {
    bool server;
    const char *client, *host, *advertise;
    uint64_t port, data_port;
    double warm_ms;
} bench_remote_args;

/* Defaults: --host 0.0.0.0, --port 14590, --warmup 200ms. */
void bench_remote_args_init(bench_remote_args *a);
/* Handles one getopt_long result c (of BENCH_REMOTE_OPTIONS) for `ect bench
 * NAME`: 1 handled, 0 not one of these flags, -1 a usage error (printed). */
int bench_remote_arg(const char *name, int c, const char *arg, bench_remote_args *a);
/* After parsing: checks --server/--client; parses the client's H:P. Returns
 * CLI_EXIT_OK or CLI_EXIT_USAGE (printed). */
int bench_remote_check(const char *name, bench_remote_args *a, char *host, size_t hostcap,
                       int *port);

/* Serves until SIGINT/SIGTERM; prints {"event":"ready","bench":NAME,...} once
 * it listens (with "push_port":N where push_port > 0, which it also tells
 * clients that send "PUSH"). */
int bench_remote_serve(const char *name, const char *host, int port, int data_port,
                       const char *advertise, int push_port);
/* Serves writes and raw-TCP sinks until SIGINT/SIGTERM. */
int bench_xport_server(const char *host, int port, int data_port, const char *advertise);
/* Measures tcp writes and the raw-TCP limit against the server at host:port,
 * their rounds alternated. */
int bench_xport_client(const char *host, int port, double secs, double warm, bool json);

/* A raw-TCP sink on the server at host:port for messages of k buffers of n
 * bytes (bench_remote_sink_iter: one message, one byte back), so a caller
 * can time its own rounds. open: 0, or -1 (nothing to close). */
typedef struct bench_remote_sink {
    int fd;
    void *const *src;
    size_t k, n;
} bench_remote_sink;
int bench_remote_sink_open(const char *host, int port, void *const *src, size_t k, size_t n,
                           bench_remote_sink *out);
int bench_remote_sink_iter(void *sink);
void bench_remote_sink_close(bench_remote_sink *s);
/* Asks the push server at host:port for its push-consumer control port. */
int bench_remote_push_port(const char *host, int port, int *push_port);

#endif
