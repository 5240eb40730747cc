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

#include <stdbool.h>
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

/* ect_host_is_wildcard is public too (ectransfer.h). */

/* The numeric local address of the interface that routes to peer (a host
 * name or numeric address, "[v6]" accepted): the source address of a UDP
 * socket connected toward it (nothing is sent). A v4-mapped v6 result is
 * written as plain IPv4. Errors: ECT_EINVAL (no peer, unresolvable),
 * ECT_EIO (no route). */
int ect_route_source(const char *peer, char *out, size_t cap);

/* The data-plane session a peer is told. session is a transport session
 * ("HOST:PORT", "ucx:HOST:PORT", "shm:@NAME"). A non-empty advertise
 * replaces HOST; otherwise a wildcard HOST becomes the local address that
 * routes to peer (ect_route_source), or loopback when peer is NULL or has no
 * route; any other session is copied unchanged (shm always). Returns 0, or
 * ECT_EINVAL when the result does not fit cap. */
int ect_session_advertise(const char *session, const char *advertise, const char *peer, char *out,
                          size_t cap);

#endif
