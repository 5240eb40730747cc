/*
 * control_server — one consumer TP rank's side of the push protocol's
 * control channel (generation 2): a REP socket on the shard's control port
 * serving every op of SPEC.md through the reservation table (rsv_), and a
 * PUSH socket on an ephemeral port sending the table's readiness and
 * abandoned events to the scheduler's inbox.
 *
 * Without CURVE keys the control port is not a libzmq socket but our own
 * ZMTP 3.0 REP listener (push/control_listener.h: the same bytes on the
 * wire, no libzmq I/O thread between the network and the handler); with
 * keys it is a libzmq REP socket with CURVE.
 *
 * One background thread owns both sockets: it polls the control port every
 * poll_ms (100 ms), answers each request (a frame that does not decode gets
 * "malformed control request", an unknown op "unknown control op: 'x'"),
 * runs the reaper every reap_interval_ms (1 s) and sends queued events
 * without blocking (an unsent event stays queued in the table, whose backlog
 * is capped at rsv.max_events, the oldest dropped).
 *
 * The table is guarded by one mutex held for table calls only, never across
 * socket I/O; ctl_server_take / _release / _stats may be called from any
 * thread while the server runs.
 *
 * A "detached" server has the table but no sockets and no thread: tests and
 * the fuzzer feed frames to ctl_server_handle directly.
 */
#ifndef ECT_PUSH_CONTROL_SERVER_H
#define ECT_PUSH_CONTROL_SERVER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "push/reservations.h"

#define CTL_DEFAULT_REAP_INTERVAL_MS 1000
#define CTL_DEFAULT_POLL_MS 100
/* Frames larger than this make ZMQ drop the sender's connection before the
 * bytes are buffered; frames up to it that the codec refuses
 * (> WIRE_CTL_MAX_FRAME) are answered "malformed control request". */
#define CTL_MAX_RECV_BYTES (2 * (int64_t)WIRE_CTL_MAX_FRAME)

typedef struct ctl_server_opts {
    const char *ip;          /* bind address; "127.0.0.1"; "*" or "0.0.0.0" only when asked */
    int port;                /* this shard's control port; 0 = ephemeral (tests) */
    int tp_size;             /* ranks of the instance, 1..64 (1) */
    int tp_rank;             /* 0..tp_size-1 (0) */
    int base_port;           /* control port of rank 0 (what `peers` lists from);
                                0: port - tp_rank (with port 0: only this shard) */
    int reap_interval_ms;    /* 1000 */
    int poll_ms;             /* 100 */
    int handshake_ms;        /* own listener (no keys): a connection's greeting and READY
                                must be through within it; 0: 30000 (libzmq's) */
    int max_conns;           /* own listener: connections beyond it are closed; 0: 1024 */
    rsv_opts rsv;            /* the table: mem ops (required), TTL, grace, caps */
    const char *dst_session; /* the transport session producers write to (required) */
    const char *advertise;   /* host told to producers in dst_session instead of the bound
                                one; NULL: the bound host, or for a wildcard bind the local
                                address that routes to each requesting peer */
    const char *transport;   /* "tcp" | "shm" | "ucx" (reply extension), may be NULL */
    const char *dst_key;     /* the pool region's key (reply extension), may be NULL */
    uint64_t pool_base;      /* dst_ptr = pool_base + offset */
    bool detached;           /* no sockets, no thread */
    /* Write windows (docs/PROTOCOL.md "Write windows"): when win_open is set,
     * every reservation told to write gets a key of its own, opened over
     * [offset, offset + nbytes) of the pool and handed out as its dst_key
     * instead of dst_key above; it is closed as soon as the reservation
     * leaves WRITING (complete, cancel, abandon, expiry). Called with the
     * table lock held; must not block. win_open returns 0 or an ECT_E* code
     * (the reservation is then abandoned: every transport has windows). */
    int (*win_open)(void *ctx, uint64_t offset, uint64_t nbytes, char key[ECT_XPORT_KEY_MAX]);
    void (*win_close)(void *ctx, const char *key);
    /* Optional (shm): offers the windows keys[0..n) a reserve or
     * reserve_batch naming "ect_shm_id" opened to that producer's shm
     * connection, before the reply goes out (docs/PROTOCOL.md "shm",
     * "Offers"). Under the table lock; must not block; failures only mean
     * the producer asks for the windows itself. */
    void (*win_offer)(void *ctx, uint64_t shm_id, const char *const *keys, size_t n);
    /* Optional: closes n windows at once (else win_close each). The shard
     * closes the windows a request ended together, before the request's
     * reply and before it opens another window. */
    void (*win_close_many)(void *ctx, const char *const *keys, size_t n);
    void *win_ctx;
    /* Who may connect (docs/SECURITY.md). keys (borrowed, must outlive the
     * server): both sockets are CURVE servers. Else event_secret (copied):
     * the PUSH socket is a PLAIN server asking for it, and the event_port
     * reply carries it. Else plain ZMQ. auth: the ZAP handler on zctx that
     * checks them (required with keys or event_secret). */
    const struct ect_keyset *keys;
    const char *event_secret;
    struct zauth *auth;
    /* Peers trusted to cancel any reservation and read its id in `status`
     * (the consumer's scheduler): NULL this host's interface addresses, "*"
     * everyone, or a comma-separated address list (push/peer_guard.h). */
    const char *trusted_peers;
} ctl_server_opts;

void ctl_server_opts_init(ctl_server_opts *o);

typedef struct ctl_server ctl_server;

/* Opens the table, binds both sockets on zctx (not owned; must outlive the
 * server; may be NULL when detached) and starts the thread. Errors:
 * ECT_EINVAL naming the option; ECT_EEXIST "address in use" when the control
 * port is taken; ECT_EIO other socket errors; ECT_ENOMEM. Caller owns *out
 * (ctl_server_close); *out is NULL on failure. */
int ctl_server_open(void *zctx, const ctl_server_opts *o, ctl_server **out);

/* Stops the thread and closes both sockets; the table stays (take, release
 * and stats still work). Idempotent. The consumer calls it, then stops its
 * transport, then ctl_server_close. */
void ctl_server_stop(ctl_server *s);

/* Stops (if not yet), then frees the table (every buffer it
 * still holds goes back through rsv.mem). The caller must stop remote writes
 * (close or unregister the transport region) before. NULL is fine. */
void ctl_server_close(ctl_server *s);

/* Bound ports (the control port, the PUSH event port); 0 when detached. */
int ctl_server_port(const ctl_server *s);
int ctl_server_event_port(const ctl_server *s);

/* Handles one request frame and returns the reply frame in *reply (caller
 * frees it). Every frame gets a reply; the return value is 0, or ECT_ENOMEM
 * when no reply could be built. Thread-safe. */
int ctl_server_handle(ctl_server *s, const void *buf, size_t len, uint64_t now_ms, char **reply);

/* Reaps now (the thread does this every reap_interval_ms). Thread-safe. */
size_t ctl_server_reap(ctl_server *s, uint64_t now_ms);

/* rsv_take / rsv_release / rsv_get_stats / rsv_check under the lock. */
int ctl_server_take(ctl_server *s, const char *transfer_id, rsv_status *st);
/* Ends the lease of mm_hash; with a transfer_id (non-NULL, non-empty) also
 * finishes that READY reservation (rsv_finish: the engine is done with it).
 * The release's error is returned; a finish that finds no READY entry (the
 * scheduler cancelled it first) is not an error. */
int ctl_server_release(ctl_server *s, const char *mm_hash, const char *transfer_id);
/* rsv_finish under the lock: ends a READY reservation, leases untouched. */
int ctl_server_finish(ctl_server *s, const char *transfer_id);

/* Reserves refused since open, by class (see ctl_server.c "Refusals"). */
typedef struct ctl_refusals {
    uint64_t full;     /* EC consumer buffer pool is full */
    uint64_t tomb;     /* answered `cancelled`: the transfer_id is a tombstone */
    uint64_t conflict; /* conflicting reservation / in-flight / cached tensor */
    uint64_t busy;     /* still has an active writer */
    uint64_t invalid;  /* a field the decoder or the table refused */
    uint64_t other;
    /* Requests refused because the live reservation belongs to another peer
     * (push/peer_guard.h), by op; status: reservation ids withheld. */
    uint64_t peer_complete, peer_cancel, peer_status, peer_reserve;
} ctl_refusals;

void ctl_server_refusals(ctl_server *s, ctl_refusals *out);
void ctl_server_stats(ctl_server *s, rsv_stats *st);
size_t ctl_server_evict(ctl_server *s, size_t max);
/* Frees every spare (rsv_spare_free_all) and closes their windows. */
size_t ctl_server_drop_spares(ctl_server *s);
int ctl_server_check(ctl_server *s);
/* Events sent on the PUSH socket and frames answered "malformed". */
uint64_t ctl_server_events_sent(ctl_server *s);

/* Totals since open for metrics: bytes and items that became READY (a
 * writer's complete), control requests handled (every frame). Any thread. */
typedef struct ctl_counters {
    uint64_t bytes_in, items_in, requests;
    uint64_t window_entries; /* window entries allocated (not taken from the spares) */
} ctl_counters;
void ctl_server_counters(ctl_server *s, ctl_counters *c);
/* rsv_count_states under the lock. */
void ctl_server_count_states(ctl_server *s, uint64_t counts[RSV_EXPIRED + 1]);

/* The latest refusals other than "pool is full" (which is back-pressure),
 * newest first: at most max of the last CTL_LAST_ERRORS. Any thread. */
#define CTL_LAST_ERRORS 8
/* The text (after "transfer_id 'X': ") of a complete or cancel refused
 * because the reservation belongs to another peer (docs/PROTOCOL.md). */
#define CTL_NOT_OWNER "reservation belongs to another peer (refused)"
/* The refusal of ect_ready to an untrusted peer (docs/PROTOCOL.md). */
#define CTL_READY_REFUSED                                                                          \
    "ect_ready refused: only a trusted peer (the consumer's own scheduler) may list ready items"
typedef struct ctl_error {
    uint64_t realtime_ms; /* wall clock, ms since the epoch */
    char text[208];
} ctl_error;
size_t ctl_server_last_errors(ctl_server *s, ctl_error *out, size_t max);
uint64_t ctl_server_bad_requests(ctl_server *s);

#endif
