/*
 * log — leveled logging, one line per call. The level comes from
 * ect_log_set_level, else from ECT_LOG (error|warn|info|debug, default
 * warn), read once; a value that is none of these is said once on stderr.
 * A line goes to the handler set with ect_log_set_handler (a binding routes
 * it into its own logging), else to stderr, written with one write so lines
 * from several threads never interleave.
 *
 * On stderr each line carries what an operator needs to correlate it: RFC
 * 3339 UTC time with milliseconds, the level, the pid, the process's role
 * (ect_log_set_role; the `ect` command sets its command name; else the
 * program's name), the module, and the transfer_id and/or mm_hash the line
 * concerns when there is one:
 *   2026-12-01T03:04:05.678Z warn pid=4242 role=push-consumer module=rsv transfer_id=t1: text
 * With ECT_LOG_FORMAT=json each line is one JSON object instead:
 *   {"time":"...","level":"warn","pid":4242,"role":"push-consumer","module":"rsv",
 *    "transfer_id":"t1","message":"text"}
 * (keys absent when there is nothing to say; strings escaped as JSON wants).
 *
 * The handler and its user pointer are read under a reader lock held for
 * the whole call, and ect_log_set_handler takes the writer lock: once it
 * returns, no thread is still inside the previous handler, so the caller may
 * free what the handler used (a binding unloading, an interpreter shutting
 * down). glibc's default rwlock prefers readers, so a handler that itself
 * makes the library log (a nested read lock) does not deadlock.
 */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "util/util.h"

static atomic_int log_level = -1;
static atomic_int log_json = -1; /* ECT_LOG_FORMAT=json, read once */
static pthread_rwlock_t handler_lock = PTHREAD_RWLOCK_INITIALIZER;
static ect_log_fn handler;      /* guarded by handler_lock */
static void *handler_user;      /* guarded by handler_lock */
static atomic_bool has_handler; /* a hint read without the lock: skip it on the stderr path */
static pthread_mutex_t role_mu = PTHREAD_MUTEX_INITIALIZER;
static char role[64]; /* [role_mu] "" = the program's name */

static const char *const tags[] = {"error", "warn", "info", "debug"};

/* Says something about the environment once, straight to stderr (not
 * through ect_log: the level may not be known yet). */
static void env_warning(atomic_bool *said, const char *what, const char *value,
                        const char *expected) {
    if (atomic_exchange(said, true)) return;
    char line[400];
    int n = snprintf(line, sizeof line, "ect: %s='%.200s' is not %s\n", what, value, expected);
    if (n > 0) {
        ssize_t w = write(STDERR_FILENO, line, strnlen(line, sizeof line));
        (void)w;
    }
}

static int level_from_env(void) {
    static atomic_bool said;
    const char *s = getenv("ECT_LOG");
    if (!s || !*s) return ECT_LOG_WARN;
    for (int i = 0; i < (int)ECT_ARRAY_LEN(tags); i++)
        if (strcasecmp(s, tags[i]) == 0) return i;
    if (strcasecmp(s, "warning") == 0) return ECT_LOG_WARN;
    env_warning(&said, "ECT_LOG", s, "a level (error, warn, info or debug); using warn");
    return ECT_LOG_WARN;
}

static bool json_format(void) {
    int cur = atomic_load(&log_json);
    if (cur >= 0) return cur;
    static atomic_bool said;
    const char *s = getenv("ECT_LOG_FORMAT");
    cur = 0;
    if (s && *s && strcasecmp(s, "json") == 0)
        cur = 1;
    else if (s && *s && strcasecmp(s, "text") != 0)
        env_warning(&said, "ECT_LOG_FORMAT", s, "text or json; using text");
    atomic_store(&log_json, cur);
    return cur;
}

void ect_log_set_level(int lvl) {
    if (lvl > ECT_LOG_DEBUG) lvl = ECT_LOG_DEBUG;
    atomic_store(&log_level, lvl < 0 ? level_from_env() : lvl);
}

int ect_log_get_level(void) {
    int cur = atomic_load(&log_level);
    if (cur < 0) {
        cur = level_from_env();
        atomic_store(&log_level, cur);
    }
    return cur;
}

bool ect_log_enabled(ect_log_level lvl) { return (int)lvl <= ect_log_get_level(); }

void ect_log_set_handler(ect_log_fn fn, void *user) {
    pthread_rwlock_wrlock(&handler_lock);
    handler = fn;
    handler_user = user;
    atomic_store(&has_handler, fn != NULL);
    pthread_rwlock_unlock(&handler_lock);
}

void ect_log_set_role(const char *r) {
    pthread_mutex_lock(&role_mu);
    snprintf(role, sizeof role, "%s", r ? r : "");
    pthread_mutex_unlock(&role_mu);
}

static void get_role(char *out, size_t cap) {
    pthread_mutex_lock(&role_mu);
    snprintf(out, cap, "%s", role[0] ? role : program_invocation_short_name);
    pthread_mutex_unlock(&role_mu);
}

/* Returns true if a handler took the line. */
static bool to_handler(const ect_log_record *base) {
    if (!atomic_load(&has_handler)) return false;
    bool taken = false;
    pthread_rwlock_rdlock(&handler_lock);
    if (handler) {
        handler(handler_user, base);
        taken = true;
    }
    pthread_rwlock_unlock(&handler_lock);
    return taken;
}

/* A growing line in a fixed buffer; writes past the end are dropped. */
typedef struct line {
    char *p;
    size_t n, cap;
} line;

static void put(line *l, const char *s, size_t k) {
    if (l->n + k > l->cap) k = l->cap - l->n;
    memcpy(l->p + l->n, s, k);
    l->n += k;
}

static void puts_(line *l, const char *s) { put(l, s, strlen(s)); }

/* s as the inside of a JSON string. */
static void put_json_str(line *l, const char *s) {
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        char esc[8];
        if (c == '"' || c == '\\') {
            esc[0] = '\\';
            esc[1] = (char)c;
            put(l, esc, 2);
        } else if (c == '\n') {
            put(l, "\\n", 2);
        } else if (c == '\t') {
            put(l, "\\t", 2);
        } else if (c < 0x20 || c == 0x7f) {
            snprintf(esc, sizeof esc, "\\u%04x", c);
            put(l, esc, 6);
        } else {
            put(l, (const char *)&c, 1);
        }
    }
}

/* A field value on a text line: as is when it has no space, '=' or quote,
 * else quoted with \" and \\ escaped (ids are short tokens; this is rare). */
static void put_text_val(line *l, const char *s) {
    if (!strpbrk(s, " =\"\\\n\t")) {
        puts_(l, s);
        return;
    }
    put(l, "\"", 1);
    put_json_str(l, s);
    put(l, "\"", 1);
}

static void vlog(ect_log_level lvl, const char *mod, const char *tid, const char *hash,
                 const char *fmt, va_list ap) __attribute__((format(printf, 5, 0)));
static void vlog(ect_log_level lvl, const char *mod, const char *tid, const char *hash,
                 const char *fmt, va_list ap) {
    if (!ect_log_enabled(lvl)) return;
    char msg[1024];
    int n = vsnprintf(msg, sizeof msg, fmt, ap);
    if (n < 0) return;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    char r[64];
    get_role(r, sizeof r);
    /* Ids are cut at 256 bytes here, so even escaped six-fold the line fits
     * the buffer below and a JSON line is never cut. */
    char tbuf[257], hbuf[257];
    if (tid && *tid) {
        snprintf(tbuf, sizeof tbuf, "%.256s", tid);
        tid = tbuf;
    } else {
        tid = NULL;
    }
    if (hash && *hash) {
        snprintf(hbuf, sizeof hbuf, "%.256s", hash);
        hash = hbuf;
    } else {
        hash = NULL;
    }
    ect_log_record rec = {
        .level = lvl,
        .module = mod,
        .message = msg,
        .realtime_ns = (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec,
        .thread_id = (uint64_t)syscall(SYS_gettid),
        .transfer_id = tid,
        .mm_hash = hash,
        .role = r,
        .pid = (uint64_t)getpid(),
    };
    if (to_handler(&rec)) return;
    char when[32], pid[24];
    ect_rfc3339_ms(rec.realtime_ns / 1000000ull, when, sizeof when);
    snprintf(pid, sizeof pid, "%llu", (unsigned long long)rec.pid);
    char buf[16384];
    line l = {buf, 0, sizeof buf - 1}; /* room for the newline */
    if (json_format()) {
        puts_(&l, "{\"time\":\"");
        puts_(&l, when);
        puts_(&l, "\",\"level\":\"");
        puts_(&l, tags[lvl]);
        puts_(&l, "\",\"pid\":");
        puts_(&l, pid);
        puts_(&l, ",\"role\":\"");
        put_json_str(&l, r);
        puts_(&l, "\",\"module\":\"");
        put_json_str(&l, mod);
        if (tid) {
            puts_(&l, "\",\"transfer_id\":\"");
            put_json_str(&l, tid);
        }
        if (hash) {
            puts_(&l, "\",\"mm_hash\":\"");
            put_json_str(&l, hash);
        }
        puts_(&l, "\",\"message\":\"");
        put_json_str(&l, msg);
        puts_(&l, "\"}");
    } else {
        puts_(&l, when);
        put(&l, " ", 1);
        puts_(&l, tags[lvl]);
        puts_(&l, " pid=");
        puts_(&l, pid);
        puts_(&l, " role=");
        put_text_val(&l, r);
        puts_(&l, " module=");
        put_text_val(&l, mod);
        if (tid) {
            puts_(&l, " transfer_id=");
            put_text_val(&l, tid);
        }
        if (hash) {
            puts_(&l, " mm_hash=");
            put_text_val(&l, hash);
        }
        puts_(&l, ": ");
        for (const char *m = msg; *m; m++) /* one line a call: a newline is written \n */
            if (*m == '\n')
                put(&l, "\\n", 2);
            else
                put(&l, m, 1);
    }
    buf[l.n++] = '\n';
    ssize_t w = write(STDERR_FILENO, buf, l.n);
    (void)w;
}

void ect_log(ect_log_level lvl, const char *mod, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vlog(lvl, mod, NULL, NULL, fmt, ap);
    va_end(ap);
}

void ect_log_ids(ect_log_level lvl, const char *mod, const char *transfer_id, const char *mm_hash,
                 const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vlog(lvl, mod, transfer_id, mm_hash, fmt, ap);
    va_end(ap);
}
