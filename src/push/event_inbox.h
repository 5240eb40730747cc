/*
 * event_inbox — the consumer scheduler's receiving end of the shards'
 * readiness events: one PULL socket connected to every shard's event port.
 *
 * Discovery (op `peers` on the configured shard, then `event_port` on each
 * shard) runs on a background thread with its own ZMQ context and control
 * client, retrying until it succeeds, so an unreachable consumer costs the
 * caller nothing. inbox_drain connects the PULL socket once the endpoints
 * are known and receives whatever is queued without ever blocking. A frame
 * that does not decode, or names a shard that is not in the peers list,
 * costs that frame only (counted in bad_frames).
 *
 * Threading: the PULL socket belongs to the caller; inbox_drain, inbox_shards
 * and inbox_bad_frames must be called from one thread at a time. inbox_close
 * interrupts a discovery exchange in flight (it shuts the thread's context
 * down) and joins the thread.
 */
#ifndef ECT_PUSH_EVENT_INBOX_H
#define ECT_PUSH_EVENT_INBOX_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "wire/control_msg.h"

typedef struct inbox inbox;

typedef struct inbox_opts {
    const char *host; /* the consumer instance's host (copied) */
    int port;         /* control port of any of its shards */
    int tp_size;      /* shards expected (1..64); peers must report this many */
    int timeout_ms;   /* control timeout for discovery exchanges */
    int retry_ms;     /* pause between failed discovery attempts (200) */
    /* CurveZMQ keys (borrowed, must outlive the inbox) for the discovery
     * exchanges and the event connections; NULL: plain ZMQ, and each shard's
     * event port gets the PLAIN secret its event_port reply names (none:
     * no handshake, as upstream) */
    const struct ect_keyset *keys;
} inbox_opts;

/* Called once per decoded event; shard is the index of ev->shard in the
 * peers list (0 .. tp_size-1). ev is valid during the call only. */
typedef void (*inbox_fn)(void *user, const wire_event *ev, size_t shard);

/* Creates the PULL socket on zctx (the caller's; must outlive the inbox) and
 * starts discovery. Errors: ECT_EINVAL naming the option; ECT_ENOMEM;
 * ECT_EIO. Caller owns *out (inbox_close). */
int inbox_open(void *zctx, const inbox_opts *o, inbox **out);

/* Connects newly discovered shards, then receives up to `max` frames without
 * blocking, calling fn for each decoded one. Returns the number of events
 * delivered. */
size_t inbox_drain(inbox *b, inbox_fn fn, void *user, size_t max);

/* Control ports of the shards in rank order, once discovered: returns their
 * count (0 before discovery succeeded) and copies up to cap of them. */
size_t inbox_shards(inbox *b, int *ports, size_t cap);

/* Blocks up to timeout_ms (>= 0) until a frame is queued on the PULL socket
 * (connecting newly discovered shards first; before discovery it checks
 * again every few ms). Returns true when one is queued, false on timeout or
 * an interrupted wait. Same thread rule as inbox_drain. */
bool inbox_wait(inbox *b, int timeout_ms);

uint64_t inbox_bad_frames(const inbox *b);

/* Stops discovery, closes the PULL socket. NULL is fine. */
void inbox_close(inbox *b);

#endif
