/*
 * peer_guard — binds each reservation of a consumer shard to the peer that
 * made it (docs/PROTOCOL.md "Reservations belong to their peer"), without
 * keys: the peer is the source address ZMQ reports for a request over tcp
 * (zmq_msg_gets "Peer-Address"), which the table keeps as the reservation's
 * owner (rsv_request.owner).
 *
 *   complete, complete_batch items   only from the owner
 *   cancel of a live reservation     from the owner or a trusted peer
 *   reservation_id in `status`       only to the owner or a trusted peer
 *   reserve of a live transfer_id    only from its owner
 *   ect_ready (the ready items)      only from a trusted peer (pg_allow with
 *                                    owner "": as a reservation with no owner)
 *
 * Trusted peers are the consumer's own scheduler: by default every address
 * configured on this host's interfaces (exact addresses, not their prefixes:
 * 127.0.0.1 is this host, 127.0.0.2 is not unless assigned), or the list
 * given. A reservation with no owner (made by a request whose address was
 * unknown) and a request with no address are matched as equals ("" == ""),
 * as before this guard.
 *
 * Honest limit: an address is a host, not a process. Any process on the
 * producer's host (or, for cancel, on this host) passes; CurveZMQ keys
 * (docs/SECURITY.md) are what authenticate a process.
 *
 * Threading: pg_open / pg_close by the owner; the checks from the control
 * server's handling thread; pg_stats from any thread (atomics).
 */
#ifndef ECT_PUSH_PEER_GUARD_H
#define ECT_PUSH_PEER_GUARD_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct peer_guard peer_guard;

typedef enum pg_act {
    PG_COMPLETE = 0, /* complete or one complete_batch item */
    PG_CANCEL,       /* cancel of a live reservation */
    PG_STATUS,       /* the reservation_id in a status reply (hidden, not refused) */
    PG_RESERVE,      /* reserve of a live transfer_id */
    PG_READY,        /* ect_ready: the listing of every ready item (trusted peers only) */
    PG_N
} pg_act;

/* trusted: NULL for this host's interface addresses; "*" for every peer
 * (cancel and status unguarded; complete still bound to the owner); else a
 * comma-separated list of addresses. Errors: ECT_EINVAL a listed address
 * that is not an IPv4/IPv6 literal; ECT_ENOMEM. Caller owns *out. */
int pg_open(const char *trusted, peer_guard **out);
void pg_close(peer_guard *g); /* NULL is fine */

/* Writes the canonical form of a Peer-Address ("::ffff:1.2.3.4" ->
 * "1.2.3.4"; NULL -> "") into out (size >= 64). */
void pg_canon(const char *peer, char *out, size_t size);

/* True when `peer` (canonical) may do `act` on a reservation owned by
 * `owner`; a refusal is counted (and logged at most once a second, naming the
 * transfer_id). PG_STATUS refusals are counted too. */
bool pg_allow(peer_guard *g, pg_act act, const char *peer, const char *owner,
              const char *transfer_id);

/* Refusals by act since open. */
uint64_t pg_refused(peer_guard *g, pg_act act);

#endif
