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
 * ROUTER mode (opts.on_msg set; the pull producer's ROUTER, issue 13): the
 * connections speak ZMTP_ROUTER, each one peer known by a connection id.
 * Messages are handed to on_msg as they come (up to CTL_LISTENER_BURST per
 * connection per pass, pipelined: no reply needed first) and answered
 * whenever the owner likes with ctl_listener_send, addressed by that id;
 * one sent to a connection that is gone is dropped, as a libzmq ROUTER
 * drops it. A connection is neither read nor handed on while more than
 * CTL_LISTENER_OUT_PAUSE bytes wait to be written to it (a peer that
 * pipelines and never reads stops being served). Binding, peer text,
 * handshake deadline, the connection and message bounds are the REP mode's.
 *
 * Threading: a listener belongs to the thread that calls ctl_listener_pass
 * (the control server's or the pull producer's ROUTER thread); nothing in it
 * is shared, unless opts.lock is set (ROUTER mode): then the owner holds
 * that mutex around every call, ctl_listener_pass lets go of it only while
 * it sleeps in poll(), and another thread holding it may meanwhile call
 * ctl_listener_send and ctl_listener_flush (the pull producer's write lanes
 * answer their pulls themselves, issue 13). Bytes such a thread leaves
 * unsent wait for a pass that polls for them: it wakes the owner (e.g.
 * through the watched fd) when ctl_listener_flush says some are left.
 */
#ifndef ECT_PUSH_CONTROL_LISTENER_H
#define ECT_PUSH_CONTROL_LISTENER_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define CTL_LISTENER_HANDSHAKE_MS 30000 /* libzmq's ZMQ_HANDSHAKE_IVL */
#define CTL_LISTENER_MAX_CONNS 1024
#define CTL_LISTENER_BURST 64             /* ROUTER mode: messages per connection per pass */
#define CTL_LISTENER_OUT_PAUSE (1u << 20) /* ROUTER mode: unsent bytes that pause a peer */

/* Answers one request: returns the reply text to send (NUL-terminated).
 * When it allocated that text it also stores it in *owned (the listener
 * frees it); a static text leaves *owned NULL. peer: the connection's peer
 * address ("" when unknown). multi: the peer sent more than one body frame
 * (body is the first). Never returns NULL. */
typedef const char *(*ctl_listener_fn)(void *ctx, const char *peer, const void *body, size_t len,
                                       bool multi, char **owned);

/* ROUTER mode: one message from connection `conn` (peer: its address, ""
 * when unknown). delim: it came with a REQ peer's empty delimiter frame,
 * which the reply must carry back (ctl_listener_send). multi: more than one
 * body frame (body is the first). */
typedef void (*ctl_listener_msg_fn)(void *ctx, uint64_t conn, const char *peer, const void *body,
                                    size_t len, bool multi, bool delim);

typedef struct ctl_listener_opts {
    const char *ip;             /* bind address (required) */
    int port;                   /* 0 = ephemeral */
    uint64_t max_msg;           /* the largest request (all its frames), >= 1 */
    int handshake_ms;           /* 0: CTL_LISTENER_HANDSHAKE_MS */
    int max_conns;              /* 0: CTL_LISTENER_MAX_CONNS */
    ctl_listener_fn fn;         /* REP mode: answers each request */
    ctl_listener_msg_fn on_msg; /* set: ROUTER mode (fn unused) */
    const char *what;           /* in errors and logs; NULL: "control server" (static text) */
    bool v4_wildcard;           /* "*" is INADDR_ANY only (libzmq without ZMQ_IPV6) */
    pthread_mutex_t *lock;      /* NULL: one thread; else see "Threading" above */
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

/* One more fd the pass waits on (POLLIN), e.g. an eventfd another thread
 * writes to wake the owner; -1 (the default) none. The listener neither
 * reads nor closes it. */
void ctl_listener_watch(ctl_listener *l, int fd);

/* One pass: waits up to timeout_ms (less when a handshake deadline comes
 * first, none when a request is already waiting) for the sockets, then
 * accepts, reads, answers at most one request per connection (ROUTER mode:
 * hands on up to CTL_LISTENER_BURST messages each) and writes. Returns true
 * when the watched fd was readable. */
bool ctl_listener_pass(ctl_listener *l, int timeout_ms);

/* ROUTER mode: queues body to connection conn ([empty delimiter] first when
 * delim). It is written by the end of the current pass when sent from
 * on_msg, else by the next ctl_listener_flush or pass. 0; ECT_ENOTFOUND when
 * the connection is gone (nothing sent); ECT_EINVAL in REP mode; ECT_ENOMEM
 * (the connection is closed). */
int ctl_listener_send(ctl_listener *l, uint64_t conn, bool delim, const void *body, size_t len);

/* Writes what is queued on every connection as far as the sockets take it
 * now, without blocking; the rest waits for POLLOUT in later passes.
 * Returns true when some is left unsent. */
bool ctl_listener_flush(ctl_listener *l);

/* Connections open now (for tests and status). */
size_t ctl_listener_conns(const ctl_listener *l);

#endif
