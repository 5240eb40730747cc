/*
 * log — leveled logging, one line per call. The level comes from
 * ect_log_set_level, else from ECT_LOG (error|warn|info|debug, default
 * warn), read once. A line goes to the handler set with ect_log_set_handler
 * (a binding routes it into its own logging), else to stderr prefixed with
 * the level and module, written with one write so lines from several
 * threads never interleave.
 *
 * The handler and its user pointer are read under a reader lock held for
 * the whole call, and ect_log_set_handler takes the writer lock: once it
 * returns, no thread is still inside the previous handler, so the caller may
 * free what the handler used (a binding unloading, an interpreter shutting
 * down). glibc's default rwlock prefers readers, so a handler that itself
 * makes the library log (a nested read lock) does not deadlock.
 */
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
static pthread_rwlock_t handler_lock = PTHREAD_RWLOCK_INITIALIZER;
static ect_log_fn handler;      /* guarded by handler_lock */
static void *handler_user;      /* guarded by handler_lock */
static atomic_bool has_handler; /* a hint read without the lock: skip it on the stderr path */

static int level_from_env(void) {
    const char *s = getenv("ECT_LOG");
    if (!s || !*s) return ECT_LOG_WARN;
    static const char *names[] = {"error", "warn", "info", "debug"};
    for (int i = 0; i < (int)ECT_ARRAY_LEN(names); i++)
        if (strcasecmp(s, names[i]) == 0) return i;
    if (strcasecmp(s, "warning") == 0) return ECT_LOG_WARN;
    return ECT_LOG_WARN;
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

/* Returns true if a handler took the line. */
static bool to_handler(ect_log_level lvl, const char *mod, const char *msg) {
    if (!atomic_load(&has_handler)) return false;
    bool taken = false;
    pthread_rwlock_rdlock(&handler_lock);
    if (handler) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ect_log_record rec = {
            .level = lvl,
            .module = mod,
            .message = msg,
            .realtime_ns = (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec,
            .thread_id = (uint64_t)syscall(SYS_gettid),
        };
        handler(handler_user, &rec);
        taken = true;
    }
    pthread_rwlock_unlock(&handler_lock);
    return taken;
}

void ect_log(ect_log_level lvl, const char *mod, const char *fmt, ...) {
    if (!ect_log_enabled(lvl)) return;
    static const char *tags[] = {"error", "warn", "info", "debug"};
    char line[1024];
    int pre = snprintf(line, sizeof line, "ect %s [%s] ", tags[lvl], mod);
    if (pre < 0 || (size_t)pre >= sizeof line) return;
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(line + pre, sizeof line - (size_t)pre, fmt, ap);
    va_end(ap);
    if (n < 0) return;
    n += pre;
    if ((size_t)n >= sizeof line - 1) n = (int)sizeof line - 2;
    line[n] = '\0';
    if (to_handler(lvl, mod, line + pre)) return;
    line[n++] = '\n';
    ssize_t w = write(STDERR_FILENO, line, (size_t)n);
    (void)w;
}
