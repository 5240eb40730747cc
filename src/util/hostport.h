/*
 * hostport — the one parser of "HOST:PORT" addresses every layer uses (the
 * data plane's sessions and listen addresses, the pull roles' producer
 * address, the push producer's consumer address, the command line).
 *
 * Accepted: "host:port" and "[v6]:port" (the brackets are stripped from the
 * host); the host is 1..cap-1 bytes; the port is decimal digits within
 * [min_port, max_port], which each caller picks for its meaning (0 = "any
 * free port" for a listen address; 1..65534 where port + 1 is bound too).
 * A bare IPv6 address without brackets ("::1:80") is refused: its last colon
 * cannot be told from the port separator.
 */
#ifndef ECT_UTIL_HOSTPORT_H
#define ECT_UTIL_HOSTPORT_H

#include <stddef.h>

#include "ectransfer.h"

/* ect_hostport_parse (the parser) is public: see ectransfer.h. */

/* Writes "host:port", or "[host]:port" when host holds a ':' (IPv6), into
 * buf (room for cap bytes). Returns snprintf's count. */
int ect_hostport_format(const char *host, int port, char *buf, size_t cap);

/* The same as a ZMQ endpoint: "tcp://host:port", "tcp://[v6]:port"; port 0
 * writes "*" (bind to any free port). */
int ect_tcp_endpoint(const char *host, int port, char *buf, size_t cap);

/* The port of a bound ZMQ endpoint (ZMQ_LAST_ENDPOINT, "tcp://HOST:PORT"),
 * or 0 when it is not one. */
int ect_tcp_endpoint_port(const char *endpoint);

#endif
