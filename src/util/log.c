/*
 * log — leveled logging to stderr, one line per call, prefixed with the
 * level and module. The level comes from ECT_LOG (error|warn|info|debug,
 * default warn), read once; lines are written with one write so lines from
 * several threads never interleave.
 */
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "util/util.h"

static atomic_int log_level = -1;

static int level_from_env(void) {
    const char *s = getenv("ECT_LOG");
    if (!s || !*s) return ECT_LOG_WARN;
    static const char *names[] = {"error", "warn", "info", "debug"};
    for (int i = 0; i < (int)ECT_ARRAY_LEN(names); i++)
        if (strcasecmp(s, names[i]) == 0) return i;
    if (strcasecmp(s, "warning") == 0) return ECT_LOG_WARN;
    return ECT_LOG_WARN;
}

void ect_log_set_level(int lvl) { atomic_store(&log_level, lvl < 0 ? level_from_env() : lvl); }

bool ect_log_enabled(ect_log_level lvl) {
    int cur = atomic_load(&log_level);
    if (cur < 0) {
        cur = level_from_env();
        atomic_store(&log_level, cur);
    }
    return (int)lvl <= cur;
}

void ect_log(ect_log_level lvl, const char *mod, const char *fmt, ...) {
    if (!ect_log_enabled(lvl)) return;
    static const char *tags[] = {"error", "warn", "info", "debug"};
    char line[1024];
    int n = snprintf(line, sizeof line, "ect %s [%s] ", tags[lvl], mod);
    va_list ap;
    va_start(ap, fmt);
    if (n >= 0 && (size_t)n < sizeof line)
        n += vsnprintf(line + n, sizeof line - (size_t)n, fmt, ap);
    va_end(ap);
    if (n < 0) return;
    if ((size_t)n >= sizeof line - 1) n = (int)sizeof line - 2;
    line[n++] = '\n';
    ssize_t w = write(STDERR_FILENO, line, (size_t)n);
    (void)w;
}
