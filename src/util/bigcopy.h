/*
 * bigcopy — one large host memcpy on two threads: the caller's and a
 * process-wide copy helper, started on the first large copy.
 *
 * Why: one thread's memcpy of a few MiB runs at ~12 GB/s here, far below
 * what the memory system moves, and a producer's step of one large item
 * over shm is mostly that copy while the other core waits for it.
 *
 * How: the copy is cut into ECT_BIGCOPY_CHUNK-byte chunks. The caller posts
 * the job for the helper, wakes it and copies chunks from the front; the
 * helper, once it runs, copies chunks from the back; they meet in the
 * middle. The caller never waits for the helper to start: a helper that is
 * busy with another caller's job, asleep past the whole copy, or absent (a
 * forked child has none, a thread that could not be made) leaves every chunk
 * to the caller, which then takes its job back. The caller waits only for
 * the chunk the helper is copying when the caller runs out of chunks, so the
 * call returns with every byte in place and the helper done with the job.
 *
 * The helper is kept off the caller's CPU (its affinity, set again when
 * the caller's CPU changed): woken from the caller, it would often be queued
 * on the caller's own CPU and the two would take turns.
 *
 * Copies under ECT_BIGCOPY_MIN bytes are a plain memcpy on the caller's
 * thread (a wake-up costs more than the half of a small copy saves).
 * ECT_COPY_THREADS=1 in the environment (read at the first large copy)
 * starts no helper: every copy on its caller's thread.
 * Threading: any thread may call ect_bigcopy; one job runs with the helper
 * at a time, the others copy alone.
 */
#ifndef ECT_UTIL_BIGCOPY_H
#define ECT_UTIL_BIGCOPY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define ECT_BIGCOPY_MIN (1u << 20)
#define ECT_BIGCOPY_CHUNK (256u << 10)

/* memcpy(dst, src, n) for host memory that does not overlap; for n of at
 * least ECT_BIGCOPY_MIN the helper thread may copy part of it. */
void ect_bigcopy(void *dst, const void *src, size_t n);

/* What the helper did since the process started: jobs it took part in and
 * chunks it copied. */
typedef struct ect_bigcopy_stats {
    uint64_t posted, joined, helper_chunks;
} ect_bigcopy_stats;
void ect_bigcopy_stats_get(ect_bigcopy_stats *s);

/* Tests: ECT_BIGCOPY_NORMAL; ECT_BIGCOPY_ALONE, no helper (every copy on the
 * caller's thread); ECT_BIGCOPY_HELPER_ONLY, the caller leaves every chunk
 * to the helper and waits for it (the helper's half checked on its own;
 * with no helper thread it would wait forever: tests only). */
enum { ECT_BIGCOPY_NORMAL, ECT_BIGCOPY_ALONE, ECT_BIGCOPY_HELPER_ONLY };
void ect_bigcopy_mode(int mode);

#endif
