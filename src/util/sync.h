/*
 * sync — timed waits on the monotonic clock. pthread_cond_timedwait measures
 * a deadline on the condition variable's clock, CLOCK_REALTIME by default: a
 * wall-clock step (NTP, an operator) then stalls such a wait or fires it
 * early. Every condition variable that is waited on with a timeout is made
 * with ect_cond_init (CLOCK_MONOTONIC) and waited on with
 * ect_cond_wait_until, whose deadline is an ect_now_ns() value.
 */
#ifndef ECT_UTIL_SYNC_H
#define ECT_UTIL_SYNC_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

/* pthread_cond_init with CLOCK_MONOTONIC. Returns pthread's error code (0). */
int ect_cond_init(pthread_cond_t *cv);

/* ect_now_ns() + ms, saturating. */
uint64_t ect_deadline_ns(uint64_t ms);

/* Waits on cv (made by ect_cond_init; mu held) until signalled or until
 * ect_now_ns() reaches deadline_ns. Returns true when the deadline passed,
 * false when woken (or spuriously: re-check the condition). */
bool ect_cond_wait_until(pthread_cond_t *cv, pthread_mutex_t *mu, uint64_t deadline_ns);

#endif
