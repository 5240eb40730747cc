/*
 * control_listener — the shard's control port as our own ZMTP 3.0 REP
 * listener (issue 13): a listening TCP socket and its accepted connections,
 * each a sans-I/O zmtp_conn (wire/zmtp.h) in role ZMTP_REP, served by one
 * poll() loop on the calling thread. A libzmq REQ or DEALER peer sees the
 * bytes a libzmq REP socket sends; what libzmq's I/O thread did for the REP
 * socket (accept, handshake, framing, fair queueing, size bound) happens
 * here, with no thread hand-off per message.
 *
 * Behaviour (docs/PROTOCOL.md "Sockets"):
 *   - bind: "*" is every address (IPv6 with IPv4 mapped, IPv4 where the host
 *     has no IPv6), otherwise a numeric address ("[v6]" accepted) or an
 *     interface name (its IPv4 address), as libzmq's bind takes; port 0 is
 *     an ephemeral port; SO_REUSEADDR and a backlog of 100, as libzmq;
 *   - accepted sockets are nonblocking with TCP_NODELAY; a connection's
 *     peer text is getpeername's address without the port (getnameinfo
 *     NI_NUMERICHOST), what libzmq gives as a message's "Peer-Address";
 *   - every request is answered through the handler, one per connection per
 *     pass (the fair queueing of libzmq's REP); a connection's next request
 *     is read only once its reply is written;
 *   - a connection is closed when its greeting and READY are not through
 *     within handshake_ms, when it sends what the codec refuses (a message
 *     over max_msg, a ZMTP 2.0 greeting, a bad frame), or when a socket
 *     error comes; connections beyond max_conns are closed as soon as they
 *     are accepted (a warning at most once a second);
 *   - replies are written without blocking; what does not fit waits for
 *     POLLOUT, so a slow reader holds up no one;
 *   - requests that arrived whole before the peer closed are still handled
 *     (their replies dropped), as libzmq does; a partial one is dropped.
 *
 * Threading: a listener belongs to the thread that calls ctl_listener_pass
 * (the control server's thread); nothing in it is shared.
 */
#ifndef ECT_PUSH_CONTROL_LISTENER_H
#define ECT_PUSH_CONTROL_LISTENER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define CTL_LISTENER_HANDSHAKE_MS 30000 /* libzmq's ZMQ_HANDSHAKE_IVL */
#define CTL_LISTENER_MAX_CONNS 1024

/* Answers one request: returns the reply text to send (NUL-terminated).
 * When it allocated that text it also stores it in *owned (the listener
 * frees it); a static text leaves *owned NULL. peer: the connection's peer
 * address ("" when unknown). multi: the peer sent more than one body frame
 * (body is the first). Never returns NULL. */
typedef const char *(*ctl_listener_fn)(void *ctx, const char *peer, const void *body, size_t len,
                                       bool multi, char **owned);

typedef struct ctl_listener_opts {
    const char *ip;   /* bind address (required) */
    int port;         /* 0 = ephemeral */
    uint64_t max_msg; /* the largest request (all its frames), >= 1 */
    int handshake_ms; /* 0: CTL_LISTENER_HANDSHAKE_MS */
    int max_conns;    /* 0: CTL_LISTENER_MAX_CONNS */
    ctl_listener_fn fn;
    void *ctx;
} ctl_listener_opts;

typedef struct ctl_listener ctl_listener;

/* Binds and listens. Errors: ECT_EINVAL (bad options, an address that is
 * neither numeric nor an interface's name), ECT_EEXIST "address in use", ECT_EIO other socket
 * errors, ECT_ENOMEM. Caller owns *out (ctl_listener_close); NULL on failure. */
int ctl_listener_open(const ctl_listener_opts *o, ctl_listener **out);

/* Closes the listening socket and every connection. NULL is fine. */
void ctl_listener_close(ctl_listener *l);

/* The bound port. */
int ctl_listener_port(const ctl_listener *l);

/* One pass: waits up to timeout_ms (less when a handshake deadline comes
 * first, none when a request is already waiting) for the sockets, then
 * accepts, reads, answers at most one request per connection and writes. */
void ctl_listener_pass(ctl_listener *l, int timeout_ms);

/* Connections open now (for tests and status). */
size_t ctl_listener_conns(const ctl_listener *l);

#endif
