/*
 * spin — a bounded busy-poll before a waiter of a control exchange sleeps.
 *
 * On a VM whose idle vCPU halts (no guest halt-polling), waking a thread
 * that sleeps in poll() costs the waker an IPI and a VM exit and the woken
 * thread a vCPU's return from halt: tens of µs per hand-off. A waiter whose
 * answer usually comes within a few tens of µs (a control reply, the next
 * request of a step) may instead poll its sockets without sleeping for up to
 * `us` µs, yielding the CPU between checks (a peer queued on the same CPU
 * runs then), and only then sleep as before.
 *
 * Adaptive: a spin that ends without an event (a miss) makes the next waits
 * sleep at once, 1, 3, 7 … up to 63 of them after consecutive misses; a spin
 * that finds its event starts over. A waiter whose answers come late thus
 * spins on at most one wait in 64. A spin during which this thread was
 * switched out while runnable (its yield ran another thread: the peer shares
 * this CPU, or the CPUs are busy) counts as a miss even when the event came,
 * and no wait spins for the next ECT_SPIN_SHARED_OFF_MS: a sleeping wait
 * would have cost no more, and a thread that keeps the CPU busy is treated
 * as a hog by the scheduler (a yield to a CPU-bound thread costs its slice,
 * where a woken sleeper runs at once). And a waiter spins only while some
 * CPU other than its own was idle at least half of the last ~10 ms
 * (/proc/stat, sampled process-wide): where no vCPU would halt, a wake-up
 * is cheap and a spin only takes CPU from others. A budget forced with
 * ect_spin_set_us (tests) is not gated.
 *
 * The budget: ECT_SPIN_US in the environment (0 … ECT_SPIN_MAX_US, 0 turns
 * spinning off; read once, at the first waiter made), else
 * ECT_SPIN_DEFAULT_US. Each waiter copies it when made (ect_spin_init).
 * One ect_spin belongs to one waiter at a time (no locking inside).
 */
#ifndef ECT_UTIL_SPIN_H
#define ECT_UTIL_SPIN_H

#include <poll.h>
#include <stdbool.h>
#include <stdint.h>

#define ECT_SPIN_MAX_US 1000u
#define ECT_SPIN_DEFAULT_US 50u
#define ECT_SPIN_MAX_SKIP 63u
#define ECT_SPIN_SHARED_OFF_MS 50u

typedef struct ect_spin {
    uint32_t us;          /* budget per wait; 0: never spin */
    uint32_t skip;        /* waits left that sleep at once (after misses) */
    uint32_t misses;      /* spins in a row that found nothing */
    uint64_t off_until_ns; /* no spin before (ect_now_ns): the CPU was shared */
    bool gated;            /* spin only while another CPU idles (ect_spin_init, unforced) */
    uint64_t spins, hits; /* spins tried, and those that found their event */
} ect_spin;

/* Parses a budget in µs ("0" … "1000", decimal digits only). ECT_EINVAL
 * with a sentence naming `what` and the range for anything else. */
int ect_spin_parse(const char *what, const char *text, uint32_t *us);

/* The process-wide budget new waiters take: ect_spin_set_us's, else
 * ECT_SPIN_US's (a bad value is logged once as a warning and turns spinning
 * off), else ECT_SPIN_DEFAULT_US. */
uint32_t ect_spin_us(void);

/* Overrides the budget new waiters take (tests, benchmarks); a value above
 * ECT_SPIN_MAX_US is capped; -1 goes back to the environment's. */
void ect_spin_set_us(int64_t us);

/* A waiter with the current budget (ect_spin_us). */
void ect_spin_init(ect_spin *s);

/* Before a wait that would sleep in poll(p, n, ...): checks p with a zero
 * timeout until one is ready or s's budget is spent (or at once returns 0
 * when s spins not this time). Returns poll's count (> 0: p's revents are
 * set, do not sleep) or 0: sleep in poll as before (revents then unset). */
int ect_spin_poll(ect_spin *s, struct pollfd *p, nfds_t n);

#endif
