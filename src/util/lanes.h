/*
 * lanes — a pool of keyed worker lanes: one thread per key (a consumer
 * session, a control address, a data-plane session), running the jobs
 * queued for that key one at a time, in the order they were submitted. A
 * lane starts on the first job for its key and ends after `idle_ms` without
 * one; a later job starts a new lane.
 *
 * Why lanes: work for one peer may block for a long time (a slow or dead
 * peer costs its whole timeout); on its own lane it holds up only the work
 * for the same peer, never another peer's.
 *
 * Jobs are intrusive (embed a lane_job); the pool never allocates them. A
 * lane may keep per-thread state (a socket belongs to one thread): ops.start
 * makes it on the lane's thread, ops.stop ends it there.
 *
 * Lending: a thread that would otherwise wait may run a lane's jobs itself
 * (lanes_lend, below), with jobs left to it by lanes_submit_quiet.
 *
 * Threading: lanes_submit from any thread; the callbacks run on the lane's
 * thread without the pool's lock, so they may call lanes_submit (another key)
 * or lane_take_queued (their own lane). lanes_close from one thread, once.
 * Waits are on the monotonic clock.
 */
#ifndef ECT_UTIL_LANES_H
#define ECT_UTIL_LANES_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct lane_job {
    struct lane_job *next; /* [pool] */
} lane_job;

typedef struct lane lane; /* one lane: its key, its thread, its queue */

typedef struct lane_ops {
    /* Optional: the lane's state, made on its thread before its first job. */
    void *(*start)(void *ctx, const char *key);
    /* Required: runs job j (the lane's thread); j belongs to run from here. */
    void (*run)(void *ctx, lane *l, void *state, lane_job *j);
    /* Optional: ends the state, on the lane's thread, after its last job. */
    void (*stop)(void *ctx, void *state);
    /* A job that will never run (lanes_close without drain): j belongs to
     * cancel. Required unless every close drains. */
    void (*cancel)(void *ctx, lane_job *j);
    void *ctx;
    /* Optional: the lane's thread went idle leaving jobs queued quietly
     * (lanes_submit_quiet) for a borrower; called on that thread, without
     * the pool's lock, so the owner can tell a thread that lends. */
    void (*lendable)(void *ctx);
    /* Optional: the lanes' thread name (at most 15 characters; top -H, perf,
     * gdb show it); NULL: "ect-lane". */
    const char *name;
} lane_ops;

typedef struct lane_pool lane_pool;

/* max_lanes >= 1 lanes at once; idle_ms >= 1. Errors: ECT_EINVAL, ECT_ENOMEM.
 * Caller owns *out (lanes_close). ops is copied. */
int lanes_open(const lane_ops *ops, size_t max_lanes, uint64_t idle_ms, lane_pool **out);

/* Queues j on the lane of `key`, starting one when there is none. Takes j on
 * success; on failure the caller keeps it. Errors: ECT_EBUSY max_lanes lanes
 * run already; ECT_ENOMEM (no thread); ECT_ECLOSED closing. */
int lanes_submit(lane_pool *lp, const char *key, lane_job *j);

/* lanes_submit, and a new lane for `key` also counts against `group` (a
 * peer's address): when group_max lanes of that group run already, the job
 * is refused with ECT_EBUSY (the caller keeps it) even below max_lanes. A
 * job for a lane that runs already is queued whatever its group. group NULL:
 * no group (lanes_submit). */
int lanes_submit_group(lane_pool *lp, const char *key, const char *group, size_t group_max,
                       lane_job *j);

/* lanes_submit that leaves the lane's queue to a borrower (*quiet set): the
 * lane's thread takes no job until a thread lent to the lane (lanes_lend)
 * takes them, a later lanes_submit to the lane or lanes_wake_quiet wakes
 * it. Only for a caller that makes sure one of these comes. So when the
 * lane is idle (started, not running, nothing handed back, nothing queued
 * that it was woken for), and when the lane's own thread submits to itself
 * with nothing else queued (it then goes idle after its job and calls
 * ops.lendable); otherwise as lanes_submit (a lent lane: queued, no wake). */
int lanes_submit_quiet(lane_pool *lp, const char *key, lane_job *j, bool *quiet);

/* Wakes every lane left asleep by lanes_submit_quiet. */
void lanes_wake_quiet(lane_pool *lp);

/* Lanes of `group` running now. */
size_t lanes_count_group(lane_pool *lp, const char *group);

/* On the lane's own thread (inside run): takes the jobs queued behind the
 * running one, in order (they will not run on the lane), or NULL. */
lane_job *lane_take_queued(lane *l);

/* The same, at most the first `max` of them (the rest stay queued, in
 * order); max 0 takes none. */
lane_job *lane_take_queued_max(lane *l, size_t max);

/* On the lane's own thread (inside run): whether jobs wait behind the running
 * one (a hint: a submit may add one right after). */
bool lane_has_queued(lane *l);

const char *lane_key(const lane *l);

/* Lending: a thread that would otherwise wait (the push producer's poll)
 * runs a lane's jobs itself instead of waking the lane's thread for them,
 * so work queued for an idle lane crosses no thread. lanes_lend picks a lane
 * whose jobs were left to a borrower (lanes_submit_quiet) and whose thread
 * is idle (not running a job),
 * marks it lent and returns it with that job (*j, which the borrower runs
 * with ops.run(ctx, l, *state, *j), the lane's own state) and *state; NULL
 * when there is none. While lent, the lane's thread takes no job and does
 * not end (so its state stays), and lanes_submit to it queues without a
 * wake-up. lane_lend_next takes the lane's next job (NULL: none, or
 * closing). lanes_lend_end gives the lane back to its thread, with
 * `resume` (or NULL): a job the borrower began and its thread must finish,
 * run before the queue with its `next` untouched (lane_ops.cancel gets it
 * so when the pool closes without drain). Only the borrower calls the last
 * two, once per lend. The state is used by one thread at a time (the lent
 * flag changes under the pool's lock), so state that belongs to a thread
 * (a libzmq socket) must not be lent. */
lane *lanes_lend(lane_pool *lp, lane_job **j, void **state);
/* (a lane with a job handed back to it, `resume`, is not lent again until
 * its thread ran that job) */
lane_job *lane_lend_next(lane *l);
void lanes_lend_end(lane *l, lane_job *resume);

/* Jobs queued, not started, on the lane of `key` (0 when none runs): for
 * tests that wait for work to be queued. */
size_t lanes_queued(lane_pool *lp, const char *key);

/* Lanes running now. */
size_t lanes_count(lane_pool *lp);

/* Stops every lane and joins it: the job each is running finishes; the
 * queued ones run too when `drain`, else go to ops.cancel. NULL is fine. */
void lanes_close(lane_pool *lp, bool drain);

#endif
