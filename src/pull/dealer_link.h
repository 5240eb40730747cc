/*
 * dealer_link — the pull consumer's DEALER to its producer spoken by the
 * consumer's own thread: ZMTP (wire/zmtp.h, DEALER role) on a plain TCP
 * socket, with no libzmq I/O thread between the caller and the kernel
 * (issue 13, fifth pass). consumer.c uses it when no CURVE keys are set; the
 * bytes on the wire are a libzmq DEALER's (docs/PROTOCOL.md "Sockets" of
 * generation 1), so a libzmq ROUTER (pyzmq, upstream vLLM) cannot tell.
 *
 * It keeps what the libzmq DEALER with its socket monitor gave consumer.c:
 *  - connecting starts at open and never blocks (TCP_NODELAY, as libzmq);
 *    a refused or failed connect is retried every 100 ms (libzmq's
 *    ZMQ_RECONNECT_IVL) while the link is driven; messages sent before the
 *    connection is through wait in the codec until the peer's READY;
 *  - events as the monitor reported them: DL_CONNECTED when a TCP
 *    connection is made, DL_DISCONNECTED when an established one ends (EOF,
 *    reset, a handshake or bytes the codec refuses, heartbeat timeout); a
 *    new connection is then attempted 100 ms later;
 *  - heartbeats as ZMQ_HEARTBEAT_IVL / _TIMEOUT: while driven, a PING goes
 *    out every ivl_ms and a connection from which nothing arrived within
 *    timeout_ms of a PING is closed (DL_DISCONNECTED), so a silent host is
 *    noticed; a closed connection is noticed at the first read;
 *  - a message over max_msg closes the connection before its body is read.
 * Nothing runs between calls: the link progresses only inside dl_pump.
 *
 * Threading: a dealer_link belongs to one thread at a time.
 */
#ifndef ECT_PULL_DEALER_LINK_H
#define ECT_PULL_DEALER_LINK_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "wire/zmtp.h"

typedef struct dealer_link dealer_link;

typedef struct dealer_link_opts {
    const char *host; /* a name or numeric address ("[v6]" accepted) */
    int port;
    uint64_t max_msg;
    int heartbeat_ivl_ms, heartbeat_timeout_ms; /* 0: no heartbeats */
} dealer_link_opts;

enum { DL_CONNECTED = 1, DL_DISCONNECTED = 2 };

/* Resolves the host and starts connecting. ECT_EINVAL (no such host),
 * ECT_ENOMEM, ECT_EIO. */
int dl_open(const dealer_link_opts *o, dealer_link **out);
void dl_close(dealer_link *l);

/* Queues a one-frame message; it goes out from the next dl_pump (after the
 * handshake). ECT_ENOMEM. */
int dl_send(dealer_link *l, const void *msg, size_t len);

/* Drives the link: waits up to wait_ms (0: not at all) for the socket,
 * then writes what is queued, reads what arrived, completes a connect,
 * reconnects, heartbeats. Returns the events that happened (DL_* bits, 0
 * when none), or ECT_EIO when poll itself failed. */
int dl_pump(dealer_link *l, int wait_ms);

/* The next whole message received (valid until the next call on l): 1, or
 * 0 when none is waiting. */
int dl_next(dealer_link *l, zmtp_msg *m);

/* Why the last DL_DISCONNECTED happened ("" before any). */
const char *dl_lost_reason(const dealer_link *l);

#endif
