/*
 * downs — which consumer addresses the push producer holds for unreachable,
 * and until when. Pure: no sockets, no clock (calls take now_ms), no lock;
 * the producer's dispatcher owns it.
 *
 * A failed control exchange (timeout or transport failure, not an
 * {"ok": false} answer) marks the address down for a backoff period that
 * starts at `initial_ms` and doubles with each further failure up to `max_ms`;
 * any successful exchange forgets the address. While the period runs, work
 * for the address fails at once (down_blocked) with the last failure's text;
 * once it ran out, the next exchange goes out as a probe, so a restarted
 * consumer is picked up again.
 *
 * Workload: a handful of consumers per producer; a linear list would do, a
 * small hash costs nothing more.
 */
#ifndef ECT_PUSH_DOWNS_H
#define ECT_PUSH_DOWNS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define DOWN_ERR_MAX 256

typedef struct down_table down_table;

/* Caller owns *out (down_close). ECT_EINVAL unless 1 <= initial_ms <= max_ms;
 * ECT_ENOMEM. */
int down_open(uint64_t initial_ms, uint64_t max_ms, down_table **out);
void down_close(down_table *t); /* NULL is fine */

/* True when `addr` is down and its backoff period has not run out at now_ms;
 * then `why` (room for `cap` bytes, may be NULL) gets
 * "consumer ADDR unreachable: LAST FAILURE (retrying in N ms)". */
bool down_blocked(const down_table *t, const char *addr, uint64_t now_ms, char *why, size_t cap);

/* A control exchange to addr failed with `error`: marks it down until
 * now_ms + backoff (the first failure: initial_ms; each failure while down
 * doubles it, up to max_ms). Returns the backoff in ms, or 0 when out of
 * memory (the address is then simply not held down). */
uint64_t down_fail(down_table *t, const char *addr, const char *error, uint64_t now_ms);

/* An exchange to addr succeeded: forgets it. */
void down_ok(down_table *t, const char *addr);

/* How many addresses are down (for tests and stats). */
size_t down_count(const down_table *t);

#endif
