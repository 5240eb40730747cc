/*
 * control_client — the REQ side of the push protocol's control channel
 * (generation 2): one object per thread, holding one REQ connection per
 * consumer shard address ("host:port"), used by the producer and the
 * consumer scheduler to send ops to consumer shards.
 *
 * Without CURVE keys (ctl_client_set_keys not called, or NULL) a connection
 * is our own ZMTP REQ (push/control_link.h) on a plain TCP socket owned by
 * the calling thread, blocking in poll(): the bytes on the wire are a libzmq
 * REQ's, but no libzmq I/O thread sits between the caller and the kernel.
 * With keys it is a libzmq REQ socket (CurveZMQ). Both behave as follows.
 *
 * Connections are made lazily on the first call to an address, the libzmq
 * ones with RCVTIMEO = SNDTIMEO = the control timeout, LINGER 0 and IPV6 1;
 * our own with TCP_NODELAY, host names and IPv6 literals resolved as libzmq
 * does, a refused connect retried every 100 ms (libzmq's reconnect interval)
 * until the timeout. In fail-fast mode (ctl_client_fail_fast) a libzmq
 * socket also gets a socket monitor (ours sees the same events on its own
 * socket) so that a dead peer fails fast: a connect that is refused
 * (nobody listens) or a connection the peer closes while a request waits ends
 * the call at once with ECT_ECONNREFUSED, while a peer that is connected but
 * slow is waited for up to the control timeout (ECT_ETIMEDOUT). An idle
 * connection whose peer went away is replaced before the next request. After any
 * failed exchange (send or receive error, timeout, undecodable reply) the
 * socket is discarded and the next call reconnects, which resets REQ's strict
 * send/receive alternation. An {"ok": false} reply is a successful exchange:
 * ctl_call returns 0 and the caller reads out->ok / out->error.
 *
 * Shard discovery (`peers`) is cached per address, only when it succeeded.
 *
 * Threading: a ctl_client and its sockets belong to the thread that opened
 * it; no function may be called from another thread. The ZMQ context is the
 * caller's and must outlive the client; zmq_ctx_shutdown of it ends any wait
 * at once (ECT_EIO), on both paths.
 */
#ifndef ECT_PUSH_CONTROL_CLIENT_H
#define ECT_PUSH_CONTROL_CLIENT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "wire/control_msg.h"

/* Default control timeout, SPEC: 30 s. */
#define CTL_DEFAULT_TIMEOUT_MS 30000

typedef struct ctl_client ctl_client;

/* The control timeout in ms for `seconds` as the spec converts it:
 * max(1, ceil(seconds * 1000)). */
int ctl_timeout_ms(double seconds);

/* Opens a client on zctx (not owned; must outlive the client) with the given
 * timeout (ms, >= 1). Caller owns *out (ctl_client_close); *out is NULL on
 * failure. Errors: ECT_EINVAL (NULL zctx, timeout < 1); ECT_ENOMEM. */
int ctl_client_open(void *zctx, int timeout_ms, ctl_client **out);

/* Fail-fast mode for the sockets opened from now on (call it right after
 * open): a refused connect or a peer that closed the connection ends a call at
 * once with ECT_ECONNREFUSED instead of after the control timeout. Off by
 * default. */
void ctl_client_fail_fast(ctl_client *c, bool on);

/* The control timeout (ms; below 1 is taken as 1) for the calls from now
 * on, as ctl_client_open's. */
void ctl_client_set_timeout(ctl_client *c, int timeout_ms);

/* Sends `req` to host:port and decodes the reply into *out (the caller
 * clears it with wire_ctl_reply_clear; it is cleared on failure). Blocks up
 * to 2 x timeout. Returns 0 when a well-formed reply arrived (check out->ok),
 * else ECT_ETIMEDOUT (connected, or connecting, but no reply in time),
 * ECT_ECONNREFUSED (fail-fast mode: connect refused, or the peer closed the
 * connection before replying, returned as soon as seen; otherwise such a peer
 * costs ECT_ETIMEDOUT after the timeout), ECT_EIO (socket errors), ECT_EPROTO (undecodable reply),
 * ECT_EINVAL (bad request or host), ECT_ENOMEM; the socket to that address is then discarded. */
int ctl_call(ctl_client *c, const char *host, int port, const wire_ctl_request *req,
             wire_ctl_reply *out);

/* Like ctl_call, but an {"ok": false} reply is returned as ECT_EPROTO with
 * the server's text in ect_last_error() (the socket is kept). */
int ctl_call_ok(ctl_client *c, const char *host, int port, const wire_ctl_request *req,
                wire_ctl_reply *out);

/* One exchange of ctl_call_many: the request, where its reply goes (cleared
 * on failure), and its outcome. */
typedef struct ctl_exchange {
    const wire_ctl_request *req;
    wire_ctl_reply *rep;
    bool want_ok;  /* an {"ok": false} reply fails it, as ctl_call_ok */
    int rc;        /* out: 0 or the error */
    char *err;     /* out: rc's text (err_cap bytes; NULL: not wanted) */
    size_t err_cap;
} ctl_exchange;

#define CTL_MANY_MAX 16

/* The n (1..CTL_MANY_MAX) exchanges x[] with host:port, each as ctl_call
 * (or ctl_call_ok where want_ok) would run it, and in that order at the
 * peer. Without keys they are pipelined on the address's one connection:
 * every request is written at once and the replies are read in order (a
 * REP answers a connection's requests one after another; the bytes of each
 * are a REQ's, docs/PROTOCOL.md "Control channel framing (ZMTP)"), so n
 * exchanges cost one round trip and one write. With keys (a libzmq REQ,
 * which cannot pipeline) one after another. A failed connection fails every
 * exchange not answered yet with its error (each x[i].rc, err); an {"ok":
 * false} or a bad reply fails only its own exchange (a bad reply also
 * those after it: the connection is dropped). Returns the first x[i].rc, or
 * ECT_EINVAL for bad arguments (no x[i] touched then). */
int ctl_call_many(ctl_client *c, const char *host, int port, ctl_exchange *x, size_t n);

/* ctl_call_many run by a thread lent to it (the push producer's poll, whose
 * own time runs out at yield_at, ms on ect_now_ms's clock): without keys it
 * returns CTL_YIELDED when yield_at passes before every reply is in (or
 * CTL_YIELDED_UNSENT at once when the address has no live connection). The
 * exchanges then go on with resume set, the same x[] (replies already in
 * stay), on any thread that holds the client next (control_link.h): each
 * keeps its control timeout and is never sent twice. With keys it never
 * yields (it is ctl_call_many: a libzmq socket is not lent). */
#define CTL_YIELDED 1
#define CTL_YIELDED_UNSENT 2 /* nothing was sent: no live connection */
int ctl_call_many_lent(ctl_client *c, const char *host, int port, ctl_exchange *x, size_t n,
                       uint64_t yield_at, bool resume);

/* The control ports of every TP rank of the consumer instance at host:port
 * (op `peers`), in rank order; at most `cap` are stored, *n gets the count
 * the shard reported (ECT_ERANGE when it exceeds cap). Cached per address
 * after the first success. Errors as ctl_call, plus ECT_EPROTO for an
 * {"ok": false} reply. */
int ctl_peers(ctl_client *c, const char *host, int port, int *ports, size_t cap, size_t *n);

/* Forgets the cached peers of host:port (e.g. after the consumer restarted). */
void ctl_forget_peers(ctl_client *c, const char *host, int port);

/* The event (PUSH) port of the shard at host:port (op `event_port`). */
int ctl_event_port(ctl_client *c, const char *host, int port, int *event_port);
/* The same, and the reply's event_secret extension ("" when absent) into
 * secret (WIRE_SECRET_MAX + 1 bytes). */
int ctl_event_port_secret(ctl_client *c, const char *host, int port, int *event_port, char *secret);

/* With ks (borrowed; must outlive the client; NULL: plain ZMQ, the default),
 * the sockets opened from now on are CurveZMQ clients (docs/SECURITY.md): a
 * server that does not accept our key ends a fail-fast call at once with
 * ECT_EACCES; otherwise it costs the control timeout. Call it right after
 * open. */
struct ect_keyset;
void ctl_client_set_keys(ctl_client *c, const struct ect_keyset *ks);

/* Closes every socket and frees c. NULL is fine. */
void ctl_client_close(ctl_client *c);

#endif
