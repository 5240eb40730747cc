/*
 * control_link — one REQ connection of the control client spoken by the
 * calling thread itself: ZMTP (wire/zmtp.h) on a plain TCP socket, blocking
 * in poll() against the call's deadline, with no libzmq I/O thread between
 * the thread and the kernel (issue 13). control_client.c uses it for every
 * address when no CURVE keys are set; the bytes on the wire are a libzmq
 * REQ's (docs/PROTOCOL.md "Control channel framing (ZMTP)").
 *
 * It keeps what control_client.h promises of the libzmq path: the connection
 * is made on first use (TCP_NODELAY, as libzmq sets it); a call waits up to
 * the control timeout for its reply, connecting included; in fail-fast mode a
 * refused connect, or a peer that closes the connection (or refuses our
 * handshake) while the request waits, ends the call at once with
 * ECT_ECONNREFUSED; otherwise a refused connect is retried every 100 ms
 * (libzmq's reconnect interval) until the timeout, so a server that comes up
 * within it is served, and a request lost with its connection costs the
 * timeout, as with libzmq's REQ (it never resends). An idle connection whose
 * peer went away (EOF, reset, or anything unasked-for on it) is replaced
 * before the next request is sent.
 *
 * Threading: a ctl_link belongs to the thread of its ctl_client.
 */
#ifndef ECT_PUSH_CONTROL_LINK_H
#define ECT_PUSH_CONTROL_LINK_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct ctl_link ctl_link;

/* One call's parameters. */
typedef struct ctl_link_call_opts {
    const char *host; /* name or numeric address, "[v6]" accepted */
    int port;
    const char *addr;    /* "host:port", for messages */
    const char *op_name; /* the op, for messages */
    int timeout_ms;
    bool fail_fast;
    uint64_t max_msg; /* the largest reply accepted */
    /* A ZMQ socket of the caller's context (NULL: none) and its ZMQ_FD: when
     * the context is shut down (zmq_ctx_shutdown) every wait ends at once
     * with ECT_EIO, as a libzmq REQ's would with ETERM. */
    void *watch;
    int watch_fd;
    /* Lending (ctl_link_call_many): at yield_at (ms, ect_now_ms's clock; 0:
     * never) the calling thread gives the call up; `resume` goes on with a
     * call given up so (see there). */
    uint64_t yield_at;
    bool resume;
} ctl_link_call_opts;

/* ctl_link_call_many gave the calling thread up (opts.yield_at): not an
 * error; _UNSENT: before anything was sent. */
#define CTL_LINK_YIELDED 2 /* (1 is the link's own LINK_LOST) */
#define CTL_LINK_YIELDED_UNSENT 3

/* Sends the request frame req (len bytes) on *lp, making the link when *lp
 * is NULL (the caller owns it then: ctl_link_close), and waits for the reply,
 * whose body is at *reply (valid until the next call on the link). Errors:
 * ECT_ETIMEDOUT, ECT_ECONNREFUSED (fail-fast, see above), ECT_EPROTO (a reply
 * that is not one ZMTP reply frame), ECT_EINVAL (host does not resolve),
 * ECT_EIO (the context is shutting down, socket errors), ECT_ENOMEM; after
 * any error the caller closes the link. */
int ctl_link_call(ctl_link **lp, const ctl_link_call_opts *o, const void *req, size_t len,
                  const uint8_t **reply, size_t *reply_len);

/* One request of ctl_link_call_many: its frame and its op (for messages;
 * NULL: the opts' op_name). */
typedef struct ctl_link_req {
    const void *frame;
    size_t len;
    const char *op_name;
} ctl_link_req;

/* Called with the reply to reqs[i], in order; the body is valid only during
 * the call. Nonzero ends ctl_link_call_many with that error. */
typedef int (*ctl_link_reply_fn)(void *ctx, size_t i, const uint8_t *body, size_t len);

/* ctl_link_call for n >= 1 requests pipelined on the one connection: all
 * are queued at once (one write once the peer is ready), then the replies
 * are read in order, each handed to on_reply, each waited for up to the
 * timeout. The bytes of each request are a REQ's; a REP (libzmq's or ours)
 * answers a connection's requests one after another, in order
 * (docs/PROTOCOL.md "Control channel framing (ZMTP)"). *ndone gets the
 * number of replies handed over: on an error, requests *ndone.. failed with
 * it (those were written, except when nothing was: a connect that failed).
 * The retry of a connection lost before the peer's READY resends them all
 * (none was written). Errors as ctl_link_call, or on_reply's.
 *
 * With o->yield_at, a thread lent to the call (the push producer's poll)
 * gives it up at that time: with no live connection it returns
 * CTL_LINK_YIELDED_UNSENT at once, before anything is sent (a connect could take
 * the whole timeout); once the requests are queued it returns
 * CTL_LINK_YIELDED when yield_at passes before the replies are in, *ndone
 * replies handed over, the rest written or queued on the codec, and each
 * waited reply keeping its own deadline. The call then goes on with
 * o->resume set, on whichever thread holds the link next (the same reqs,
 * on_reply's replies numbered as before, *ndone counting from the start):
 * the request is never sent twice and its control timeout runs as if the
 * call had never been given up. A call with nothing begun resumes as a
 * fresh call. */
int ctl_link_call_many(ctl_link **lp, const ctl_link_call_opts *o, const ctl_link_req *reqs,
                       size_t n, ctl_link_reply_fn on_reply, void *ctx, size_t *ndone);

/* Closes the connection and frees l. NULL is fine. */
void ctl_link_close(ctl_link *l);

#endif
