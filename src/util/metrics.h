/*
 * metrics — the process-wide registry behind ect_metrics_text(): counters,
 * gauges and histograms kept with atomics (an update is one relaxed atomic
 * add, never a lock), and the sources that expose them.
 *
 * A source is one role object (a push consumer shard, a scheduler, a
 * producer, ...) registered while it lives, with base labels role and shard
 * and a collect callback. Rendering (met_render) holds the registry lock and
 * calls every source's callback, which reports its samples through met_out;
 * so once met_source_remove returns no callback of that source runs and the
 * object may be freed. A callback may take the object's own locks (the
 * registry lock is always taken first) but must not add or remove sources.
 *
 * Output is the Prometheus text exposition format 0.0.4: one # HELP and one
 * # TYPE line per metric name, then its samples; names carry the
 * ectransfer_ prefix, counters end in _total, and no label is ever a
 * transfer id (the label sets stay small and fixed).
 */
#ifndef ECT_UTIL_METRICS_H
#define ECT_UTIL_METRICS_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

typedef struct met_counter {
    atomic_uint_fast64_t v;
} met_counter;

static inline void met_add(met_counter *c, uint64_t n) {
    atomic_fetch_add_explicit(&c->v, n, memory_order_relaxed);
}
static inline uint64_t met_get(const met_counter *c) {
    return atomic_load_explicit(&((met_counter *)c)->v, memory_order_relaxed);
}

/* Latency buckets in seconds: 100 us .. 60 s, then +Inf. */
#define MET_BUCKETS 17
extern const double met_bucket_le[MET_BUCKETS];

typedef struct met_hist {
    atomic_uint_fast64_t bucket[MET_BUCKETS + 1]; /* not cumulative; the last is +Inf */
    atomic_uint_fast64_t sum_ns;
    atomic_uint_fast64_t count;
} met_hist;

/* Records one duration. Any thread, lock-free. */
void met_observe_ns(met_hist *h, uint64_t ns);

typedef struct met_out met_out;
typedef void (*met_collect_fn)(void *ctx, met_out *out);
typedef struct met_source met_source;

/* Registers a source with labels role="ROLE",shard="SHARD" (shard may be
 * NULL: no shard label). Errors: ECT_ENOMEM. Caller owns *out
 * (met_source_remove). */
int met_source_add(const char *role, const char *shard, met_collect_fn fn, void *ctx,
                   met_source **out);
/* Unregisters and frees; when it returns the callback is not running and
 * will not be called again. NULL is fine. */
void met_source_remove(met_source *s);

/* In a callback: one sample each. name is the full metric name (a string
 * that outlives the render, normally a literal); help likewise. labels: the
 * extra labels, written by met_labels, or NULL. */
void met_out_counter(met_out *o, const char *name, const char *help, const char *labels,
                     uint64_t v);
void met_out_gauge(met_out *o, const char *name, const char *help, const char *labels, double v);
void met_out_hist(met_out *o, const char *name, const char *help, const char *labels,
                  const met_hist *h);

/* The series every role shares, each named and described here once.
 * moved: ectransfer_bytes_total and ectransfer_items_total with labels (the
 * transport and direction, from met_labels). pool: the buffer pool's
 * capacity, used and resident bytes. failure: ectransfer_failures_total
 * {reason}. latency: ectransfer_transfer_seconds {phase}. control_requests:
 * ectransfer_control_requests_total. */
void met_out_moved(met_out *o, const char *labels, uint64_t bytes, uint64_t items);
void met_out_pool(met_out *o, double capacity, double used, double resident);
void met_out_failure(met_out *o, const char *reason, uint64_t n);
void met_out_latency(met_out *o, const char *phase, const met_hist *h);
void met_out_control_requests(met_out *o, uint64_t n);

/* Writes k1="v1",k2="v2",... (values escaped as the format wants) into buf
 * from NULL-terminated key, value pairs; returns buf. Truncates silently at
 * cap (label values here are short fixed words). */
const char *met_labels(char *buf, size_t cap, ...);

/* Renders every source; caller frees. NULL when out of memory. */
char *met_render(void);

/* Appends s to buf escaped as a label value (\\, \", \n). */
void met_escape(char *buf, size_t cap, const char *s);

#endif
