/*
 * metrics — see metrics.h. The registry is a doubly linked list of sources
 * under one mutex, held while rendering (callbacks run under it) and while a
 * source is added or removed; updates of the values themselves never take it.
 *
 * Rendering gathers every source's samples, sorts them by metric name
 * (stable, so a family's samples keep their order) and writes one # HELP and
 * # TYPE pair per name, which the format requires even when several sources
 * (the shards of one process) report the same name.
 */
#include <inttypes.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/metrics.h"
#include "util/util.h"

const double met_bucket_le[MET_BUCKETS] = {0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005,
                                           0.01,   0.025,   0.05,   0.1,   0.25,   0.5,
                                           1,      2.5,     5,      10,    60};

struct met_source {
    met_source *prev, *next;
    char base[160]; /* role="...",shard="..." */
    met_collect_fn fn;
    void *ctx;
};

static pthread_mutex_t reg_mu = PTHREAD_MUTEX_INITIALIZER;
static met_source *reg_head; /* [reg_mu] */

typedef enum { MET_T_COUNTER, MET_T_GAUGE, MET_T_HIST } met_type;

typedef struct sample {
    const char *name, *help;
    met_type type;
    size_t seq;
    char *text; /* the sample lines, each ending in \n */
} sample;

struct met_out {
    const met_source *src;
    sample *v;
    size_t n, cap;
    bool oom;
};

void met_observe_ns(met_hist *h, uint64_t ns) {
    double s = (double)ns / 1e9;
    size_t i = 0;
    while (i < MET_BUCKETS && s > met_bucket_le[i]) i++;
    atomic_fetch_add_explicit(&h->bucket[i], 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&h->sum_ns, ns, memory_order_relaxed);
    atomic_fetch_add_explicit(&h->count, 1, memory_order_relaxed);
}

void met_escape(char *buf, size_t cap, const char *s) {
    size_t n = strlen(buf);
    for (; *s && n + 3 < cap; s++) {
        if (*s == '\\' || *s == '"') {
            buf[n++] = '\\';
            buf[n++] = *s;
        } else if (*s == '\n') {
            buf[n++] = '\\';
            buf[n++] = 'n';
        } else {
            buf[n++] = *s;
        }
    }
    buf[n] = '\0';
}

static void vlabels(char *buf, size_t cap, va_list ap) {
    buf[0] = '\0';
    const char *k;
    bool first = true;
    while ((k = va_arg(ap, const char *)) != NULL) {
        const char *v = va_arg(ap, const char *);
        size_t n = strlen(buf);
        snprintf(buf + n, cap - n, "%s%s=\"", first ? "" : ",", k);
        met_escape(buf, cap, v ? v : "");
        n = strlen(buf);
        snprintf(buf + n, cap - n, "\"");
        first = false;
    }
}

const char *met_labels(char *buf, size_t cap, ...) {
    va_list ap;
    va_start(ap, cap);
    vlabels(buf, cap, ap);
    va_end(ap);
    return buf;
}

int met_source_add(const char *role, const char *shard, met_collect_fn fn, void *ctx,
                   met_source **out) {
    *out = NULL;
    met_source *s = calloc(1, sizeof *s);
    if (!s) return ect_set_error(ECT_ENOMEM, "metrics: out of memory");
    if (shard)
        met_labels(s->base, sizeof s->base, "role", role, "shard", shard, (const char *)NULL);
    else
        met_labels(s->base, sizeof s->base, "role", role, (const char *)NULL);
    s->fn = fn;
    s->ctx = ctx;
    pthread_mutex_lock(&reg_mu);
    s->next = reg_head;
    if (reg_head) reg_head->prev = s;
    reg_head = s;
    pthread_mutex_unlock(&reg_mu);
    *out = s;
    return 0;
}

void met_source_remove(met_source *s) {
    if (!s) return;
    pthread_mutex_lock(&reg_mu);
    if (s->prev)
        s->prev->next = s->next;
    else
        reg_head = s->next;
    if (s->next) s->next->prev = s->prev;
    pthread_mutex_unlock(&reg_mu);
    free(s);
}

/* A growable string. */
typedef struct sbuf {
    char *p;
    size_t n, cap;
    bool oom;
} sbuf;

static void sb_printf(sbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void sb_printf(sbuf *b, const char *fmt, ...) {
    if (b->oom) return;
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        int k = vsnprintf(b->p ? b->p + b->n : NULL, b->p ? b->cap - b->n : 0, fmt, ap);
        va_end(ap);
        if (k < 0) {
            b->oom = true;
            return;
        }
        if (b->p && b->n + (size_t)k < b->cap) {
            b->n += (size_t)k;
            return;
        }
        size_t cap = b->cap ? b->cap * 2 : 1024;
        while (cap < b->n + (size_t)k + 1) cap *= 2;
        char *np = realloc(b->p, cap);
        if (!np) {
            b->oom = true;
            return;
        }
        b->p = np;
        b->cap = cap;
    }
}

/* name{base,extra[,more]} */
static void sb_series(sbuf *b, const char *name, const char *suffix, const char *base,
                      const char *extra, const char *more) {
    sb_printf(b, "%s%s{%s", name, suffix, base);
    if (extra && *extra) sb_printf(b, "%s%s", *base ? "," : "", extra);
    if (more) sb_printf(b, "%s%s", (*base || (extra && *extra)) ? "," : "", more);
    sb_printf(b, "}");
}

static void push_sample(met_out *o, const char *name, const char *help, met_type t, sbuf *b) {
    if (b->oom || o->oom) {
        free(b->p);
        o->oom = true;
        return;
    }
    if (o->n == o->cap) {
        size_t cap = o->cap ? o->cap * 2 : 64;
        sample *nv = realloc(o->v, cap * sizeof *nv);
        if (!nv) {
            free(b->p);
            o->oom = true;
            return;
        }
        o->v = nv;
        o->cap = cap;
    }
    o->v[o->n] = (sample){.name = name, .help = help, .type = t, .seq = o->n, .text = b->p};
    o->n++;
}

void met_out_counter(met_out *o, const char *name, const char *help, const char *labels,
                     uint64_t v) {
    sbuf b = {0};
    sb_series(&b, name, "", o->src->base, labels, NULL);
    sb_printf(&b, " %" PRIu64 "\n", v);
    push_sample(o, name, help, MET_T_COUNTER, &b);
}

void met_out_gauge(met_out *o, const char *name, const char *help, const char *labels, double v) {
    sbuf b = {0};
    sb_series(&b, name, "", o->src->base, labels, NULL);
    sb_printf(&b, " %.17g\n", v);
    push_sample(o, name, help, MET_T_GAUGE, &b);
}

void met_out_hist(met_out *o, const char *name, const char *help, const char *labels,
                  const met_hist *h) {
    sbuf b = {0};
    /* Read the buckets first and derive the count from them, so the +Inf
     * bucket always equals _count even while observations land. */
    uint64_t cum = 0;
    for (size_t i = 0; i <= MET_BUCKETS; i++) {
        cum += atomic_load_explicit(&((met_hist *)h)->bucket[i], memory_order_relaxed);
        char le[48];
        if (i < MET_BUCKETS)
            snprintf(le, sizeof le, "le=\"%g\"", met_bucket_le[i]);
        else
            snprintf(le, sizeof le, "le=\"+Inf\"");
        sb_series(&b, name, "_bucket", o->src->base, labels, le);
        sb_printf(&b, " %" PRIu64 "\n", cum);
    }
    uint64_t sum = atomic_load_explicit(&((met_hist *)h)->sum_ns, memory_order_relaxed);
    sb_series(&b, name, "_sum", o->src->base, labels, NULL);
    sb_printf(&b, " %.9g\n", (double)sum / 1e9);
    sb_series(&b, name, "_count", o->src->base, labels, NULL);
    sb_printf(&b, " %" PRIu64 "\n", cum);
    push_sample(o, name, help, MET_T_HIST, &b);
}

static int by_name(const void *a, const void *b) {
    const sample *x = a, *y = b;
    int c = strcmp(x->name, y->name);
    if (c) return c;
    return x->seq < y->seq ? -1 : x->seq > y->seq;
}

char *met_render(void) {
    met_out o = {0};
    pthread_mutex_lock(&reg_mu);
    for (met_source *s = reg_head; s; s = s->next) {
        o.src = s;
        s->fn(s->ctx, &o);
    }
    pthread_mutex_unlock(&reg_mu);
    if (o.n) qsort(o.v, o.n, sizeof *o.v, by_name);
    sbuf b = {0};
    sb_printf(&b, "%s", "");
    static const char *const types[] = {"counter", "gauge", "histogram"};
    for (size_t i = 0; i < o.n; i++) {
        if (i == 0 || strcmp(o.v[i].name, o.v[i - 1].name) != 0) {
            sb_printf(&b, "# HELP %s ", o.v[i].name);
            for (const char *h = o.v[i].help; h && *h; h++) { /* HELP escapes \ and \n */
                if (*h == '\\')
                    sb_printf(&b, "\\\\");
                else if (*h == '\n')
                    sb_printf(&b, "\\n");
                else
                    sb_printf(&b, "%c", *h);
            }
            sb_printf(&b, "\n# TYPE %s %s\n", o.v[i].name, types[o.v[i].type]);
        }
        sb_printf(&b, "%s", o.v[i].text);
    }
    for (size_t i = 0; i < o.n; i++) free(o.v[i].text);
    free(o.v);
    if (b.oom || o.oom) {
        free(b.p);
        ect_set_error(ECT_ENOMEM, "metrics: out of memory");
        return NULL;
    }
    return b.p;
}

char *ect_metrics_text(void) { return met_render(); }

void met_out_moved(met_out *o, const char *labels, uint64_t bytes, uint64_t items) {
    met_out_counter(o, "ectransfer_bytes_total",
                    "Bytes moved, by direction (in: received, out: sent; a push producer counts "
                    "every shard) and transport.",
                    labels, bytes);
    met_out_counter(o, "ectransfer_items_total",
                    "Items moved, by direction and transport (push consumer: reservations that "
                    "became READY; push producer: transfers done with a write; pull: pulls).",
                    labels, items);
}

void met_out_pool(met_out *o, double capacity, double used, double resident) {
    met_out_gauge(o, "ectransfer_pool_capacity_bytes", "Usable bytes of the buffer pool.", NULL,
                  capacity);
    met_out_gauge(o, "ectransfer_pool_used_bytes",
                  "Bytes allocated in the buffer pool, resident items included.", NULL, used);
    met_out_gauge(o, "ectransfer_pool_resident_bytes", "Bytes held by resident (cached) items.",
                  NULL, resident);
}

void met_out_failure(met_out *o, const char *reason, uint64_t n) {
    char l[96];
    met_out_counter(o, "ectransfer_failures_total", "Transfers that failed, by reason.",
                    met_labels(l, sizeof l, "reason", reason, (const char *)NULL), n);
}

void met_out_latency(met_out *o, const char *phase, const met_hist *h) {
    char l[96];
    met_out_hist(o, "ectransfer_transfer_seconds",
                 "Transfer latency: push producer reserve -> done; pull consumer load -> complete.",
                 met_labels(l, sizeof l, "phase", phase, (const char *)NULL), h);
}

void met_out_control_requests(met_out *o, uint64_t n) {
    met_out_counter(
        o, "ectransfer_control_requests_total",
        "Control round trips (sent by a producer or scheduler, served by a consumer shard).", NULL,
        n);
}
