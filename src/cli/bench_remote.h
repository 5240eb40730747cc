/* bench_remote — the two-host mode of `ect bench xport` (see bench_remote.c). */
#ifndef ECT_CLI_BENCH_REMOTE_H
#define ECT_CLI_BENCH_REMOTE_H

#include <stdbool.h>

/* Serves until SIGINT/SIGTERM; prints {"event":"ready",...} once it listens. */
int bench_xport_server(const char *host, int port, int data_port, const char *advertise);
/* Measures tcp writes and the raw-TCP limit against the server at host:port. */
int bench_xport_client(const char *host, int port, double secs, double warm, bool json);

#endif
