/*
 * zmtp — ZMTP 3.x (https://rfc.zeromq.org/spec/23/; our greeting says 3.1,
 * as libzmq 4.3's does, RFC 37's PING/PONG) with the NULL mechanism, sans I/O: the bytes a REQ or
 * REP end of the push control channel, or a DEALER or ROUTER end of the pull channel, exchanges
 * with a libzmq peer, so that a thread can speak them on its own socket instead of handing every
 * message to libzmq's I/O thread and back (issue 13).
 * The bytes on the wire are exactly what a libzmq REQ, REP, DEALER or ROUTER socket sends; a
 * libzmq (pyzmq, upstream vLLM) peer cannot tell the difference.
 * docs/PROTOCOL.md "Control channel framing (ZMTP)" lists them byte for byte.
 *
 * What a zmtp_conn does: it is fed the bytes read from the socket
 * (zmtp_conn_feed) and says what to send (zmtp_conn_out / zmtp_conn_sent). It
 * queues our greeting and READY at once when made (a libzmq peer sends its
 * greeting in pieces and waits for ours: we never wait for theirs first),
 * checks the peer's greeting (signature, major version >= 3, mechanism NULL)
 * and READY (Socket-Type a valid peer of ours, as libzmq checks: REQ talks to
 * REP or ROUTER, REP to REQ or DEALER, DEALER to REP, DEALER or ROUTER, ROUTER
 * to REQ, DEALER or ROUTER), answers PING with PONG (ZMTP 3.1 peers with heartbeats
 * on), ignores other commands, and assembles whole messages (frames up to one
 * without MORE) that zmtp_conn_next hands out one at a time. A message queued
 * before the peer's READY is held back until it comes (libzmq 4.3 drops a
 * connection whose first message arrives in the same read as our READY).
 *
 * Messages are the application's view of REQ/REP:
 *   - a REQ end sends [empty delimiter][body] (zmtp_conn_send_req) and gets
 *     back the body of the reply (zmtp_conn_next checks and strips the
 *     delimiter; a reply without one is ECT_EPROTO);
 *   - a REP end gets every frame up to and including the empty delimiter as
 *     the envelope plus the body (a peer may send several body frames: the
 *     message is then flagged `multi` and the body is the first), and answers
 *     with zmtp_conn_send_rep (envelope, then the reply body). A message
 *     without a delimiter is dropped, as libzmq's REP drops it.
 * A REQ flags a reply of several body frames `multi` too.
 *   - a DEALER sends and receives frames as they are: zmtp_conn_send queues a
 *     one-frame message; a received message's first frame is the body (more
 *     frames: `multi`).
 *   - a ROUTER end is one connection, i.e. one peer: no identity frames on
 *     the wire (the caller knows the peer by its connection). A received
 *     message whose first frame is empty and has more (a REQ peer's
 *     delimiter) carries it as the envelope (`01 00`), the next frame as the
 *     body; otherwise the first frame is the body. Replies: zmtp_conn_send_rep
 *     with that envelope (or zmtp_conn_send without one).
 *
 * Bounds: a message whose frames sum over `max_msg` bytes is refused
 * (ECT_ERANGE) the moment its size is known, before it is buffered; an
 * envelope over ZMTP_MAX_ENVELOPE frames is ECT_EPROTO. Every error is final:
 * the connection must be closed (the text is in ect_last_error()).
 *
 * Threading: a zmtp_conn belongs to one thread at a time; nothing is shared.
 */
#ifndef ECT_WIRE_ZMTP_H
#define ECT_WIRE_ZMTP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define ZMTP_GREETING_LEN 64
#define ZMTP_MAX_ENVELOPE                                                                          \
    32 /* frames before the delimiter (REQ sends none; a DEALER may route)                         \
        */

typedef enum { ZMTP_REQ, ZMTP_REP, ZMTP_DEALER, ZMTP_ROUTER } zmtp_role;

typedef struct zmtp_conn zmtp_conn;

/* One received message. The pointers stay valid until the next call on the
 * conn (feed, next, send_*, close). */
typedef struct zmtp_msg {
    const uint8_t *body; /* the (first) body frame */
    size_t body_len;
    bool multi;              /* the peer sent more than one body frame */
    const uint8_t *envelope; /* REP: the envelope as framed bytes, for send_rep */
    size_t envelope_len;
} zmtp_msg;

/* A new connection's state for our `role`; our greeting and READY are queued
 * for sending already. max_msg: the largest message accepted (>= 1).
 * Errors: ECT_EINVAL, ECT_ENOMEM. */
int zmtp_conn_new(zmtp_role role, uint64_t max_msg, zmtp_conn **out);
void zmtp_conn_free(zmtp_conn *c);

/* Consumes `len` received bytes (any split: one byte at a time works).
 * Returns 0, or an error (ECT_EPROTO: bad greeting, unsupported mechanism or
 * version, a peer socket type we cannot talk to, malformed frame or command,
 * a command or frame in the wrong place; ECT_ERANGE: a message over max_msg;
 * ECT_ENOMEM). After an error every call fails the same way. */
int zmtp_conn_feed(zmtp_conn *c, const uint8_t *data, size_t len);

/* True once the peer's greeting and READY are in (messages flow; one queued
 * before that was held back and is in zmtp_conn_out now). */
bool zmtp_conn_ready(const zmtp_conn *c);

/* The next whole message received, into *m: returns 1 when one was there, 0
 * when none is complete yet, or an error (ECT_EPROTO: REQ got a reply without
 * the empty delimiter). */
int zmtp_conn_next(zmtp_conn *c, zmtp_msg *m);

/* Queue a message for sending. REQ: [delimiter][body]. REP, ROUTER: the
 * envelope a zmtp_msg carried (bytes as it gave them), then [body]. DEALER,
 * ROUTER (zmtp_conn_send): [body]. ECT_ENOMEM; ECT_EINVAL for the wrong role. */
int zmtp_conn_send_req(zmtp_conn *c, const void *body, size_t len);
int zmtp_conn_send_rep(zmtp_conn *c, const uint8_t *envelope, size_t envelope_len, const void *body,
                       size_t len);
int zmtp_conn_send(zmtp_conn *c, const void *body, size_t len);

/* Queue a PING (heartbeat, RFC 37) as libzmq's ZMQ_HEARTBEAT_IVL sends it:
 * TTL 0, no context (`04 07 04 50 49 4e 47 00 00`). Nothing before the
 * peer's READY. ECT_ENOMEM. */
int zmtp_conn_ping(zmtp_conn *c);

/* What is queued for sending: *len bytes at the returned pointer (NULL, 0
 * when nothing). After writing n of them, zmtp_conn_sent(c, n). */
const uint8_t *zmtp_conn_out(const zmtp_conn *c, size_t *len);
void zmtp_conn_sent(zmtp_conn *c, size_t n);

/* The peer's Socket-Type from its READY ("REQ", "DEALER", ...; "" before the
 * handshake), for logs and tests. */
const char *zmtp_conn_peer_type(const zmtp_conn *c);

/* The codec's two I/O helpers (zmtp_fd.c), for a connected non-blocking
 * stream socket; shared by the clients that own one (push control_link,
 * pull dealer_link). ZMTP_FD_LOST means the connection is gone: EOF
 * (ECT_ECLOSED, "the peer closed the connection") or a socket error
 * ("send: ..." / "receive: ..."), set as the last error.
 * zmtp_fd_flush writes what the codec queued as far as fd takes it now: 0
 * (all written, or the socket is full), or ZMTP_FD_LOST.
 * zmtp_fd_fill reads what fd has into the codec through buf (cap bytes at a
 * time) until it would block: 0, ZMTP_FD_LOST, or the codec's error for
 * bytes it refuses. *heard (may be NULL) is set true when a byte came. */
#define ZMTP_FD_LOST 1
int zmtp_fd_flush(zmtp_conn *c, int fd);
int zmtp_fd_fill(zmtp_conn *c, int fd, uint8_t *buf, size_t cap, bool *heard);

/* The stream addresses of host:port as libzmq's tcp:// connect resolves
 * them (getaddrinfo; an IPv6 literal may come in brackets). 0 and *out (free
 * with freeaddrinfo), or ECT_EINVAL naming `who` and the host. */
struct addrinfo;
int zmtp_fd_resolve(const char *who, const char *host, int port, struct addrinfo **out);

#endif
