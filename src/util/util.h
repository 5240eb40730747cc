/*
 * util — internal helpers every layer uses: error detail, logging, the
 * monotonic clock, random ids and overflow-checked size arithmetic.
 * Pure except for logging (stderr) and the id generator (getrandom).
 */
#ifndef ECT_UTIL_H
#define ECT_UTIL_H

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "ectransfer.h"

#define ECT_ARRAY_LEN(a) (sizeof(a) / sizeof((a)[0]))

/* ---- errors: record a detail sentence for ect_last_error(), return code. */
int ect_set_error(int code, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Wraps errno `e` as an ECT_E* code with "what: strerror(e)" as detail. */
int ect_set_errno(int e, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void ect_clear_error(void);

/* A constructor's failure path: runs `cleanup` (its close, which may set
 * errors of its own) and returns `rc` with the error detail from before. */
#define ECT_RETURN_AFTER(rc, cleanup)                                                              \
    do {                                                                                           \
        char ect_saved_[1024];                                                                     \
        snprintf(ect_saved_, sizeof ect_saved_, "%s", ect_last_error());                           \
        cleanup;                                                                                   \
        return ect_set_error((rc), "%s", ect_saved_);                                              \
    } while (0)

/* ---- logging: level from ECT_LOG=error|warn|info|debug (default warn) or
 * ect_log_set_level; lines go to the handler of ect_log_set_handler, else
 * stderr (ect_log_level and both setters are public, in ectransfer.h). */
bool ect_log_enabled(ect_log_level lvl);
void ect_log(ect_log_level lvl, const char *mod, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* The same for a line about one transfer: transfer_id and/or mm_hash (NULL
 * or "" when unknown) become fields of the line (log.c shows the format). */
void ect_log_ids(ect_log_level lvl, const char *mod, const char *transfer_id, const char *mm_hash,
                 const char *fmt, ...) __attribute__((format(printf, 5, 6)));
#define ECT_LOGE_ID(mod, tid, hash, ...) ect_log_ids(ECT_LOG_ERROR, mod, tid, hash, __VA_ARGS__)
#define ECT_LOGW_ID(mod, tid, hash, ...) ect_log_ids(ECT_LOG_WARN, mod, tid, hash, __VA_ARGS__)
#define ECT_LOGI_ID(mod, tid, hash, ...)                                                           \
    do {                                                                                           \
        if (ect_log_enabled(ECT_LOG_INFO)) ect_log_ids(ECT_LOG_INFO, mod, tid, hash, __VA_ARGS__); \
    } while (0)
#define ECT_LOGD_ID(mod, tid, hash, ...)                                                           \
    do {                                                                                           \
        if (ect_log_enabled(ECT_LOG_DEBUG))                                                        \
            ect_log_ids(ECT_LOG_DEBUG, mod, tid, hash, __VA_ARGS__);                               \
    } while (0)

#define ECT_LOGE(mod, ...) ect_log(ECT_LOG_ERROR, mod, __VA_ARGS__)
#define ECT_LOGW(mod, ...) ect_log(ECT_LOG_WARN, mod, __VA_ARGS__)
#define ECT_LOGI(mod, ...)                                                                         \
    do {                                                                                           \
        if (ect_log_enabled(ECT_LOG_INFO)) ect_log(ECT_LOG_INFO, mod, __VA_ARGS__);                \
    } while (0)
#define ECT_LOGD(mod, ...)                                                                         \
    do {                                                                                           \
        if (ect_log_enabled(ECT_LOG_DEBUG)) ect_log(ECT_LOG_DEBUG, mod, __VA_ARGS__);              \
    } while (0)

/* ---- clock: CLOCK_MONOTONIC. */
uint64_t ect_now_ns(void);
uint64_t ect_now_ms(void);
double ect_now_s(void);
/* The wall clock (CLOCK_REALTIME) in ms since the epoch. */
uint64_t ect_realtime_ms(void);
/* RFC 3339 UTC time with milliseconds, "2026-12-01T03:04:05.678Z", into buf
 * (room for at least 25 bytes); returns buf. */
const char *ect_rfc3339_ms(uint64_t realtime_ms, char *buf, size_t cap);

/* ---- ids: 32 lowercase hex digits from the OS random source (like uuid4().hex). */
#define ECT_ID_LEN 32
void ect_random_id(char out[ECT_ID_LEN + 1]);
uint64_t ect_random_u64(void);

/* ---- strings: copies src (NULL: "") into dst of cap > 0 bytes, cut to cap - 1
 * bytes, always NUL-terminated: snprintf(dst, cap, "%s", src) without the
 * format machinery (it was a few per cent of a small item's CPU, issue 13). */
static inline void ect_strcpy_cut(char *dst, size_t cap, const char *src) {
    size_t n = src ? strnlen(src, cap - 1) : 0;
    if (n) memcpy(dst, src, n);
    dst[n] = '\0';
}

/* Appends src (NULL: "") to the string in dst (cap > 0 bytes), the whole cut
 * to cap - 1 bytes: a per-item key built without snprintf. */
static inline void ect_strcat_cut(char *dst, size_t cap, const char *src) {
    size_t n = strnlen(dst, cap - 1);
    ect_strcpy_cut(dst + n, cap - n, src);
}

/* ---- checked arithmetic: return false on overflow. */
static inline bool ect_mul_u64(uint64_t a, uint64_t b, uint64_t *out) {
    return !__builtin_mul_overflow(a, b, out);
}
static inline bool ect_add_u64(uint64_t a, uint64_t b, uint64_t *out) {
    return !__builtin_add_overflow(a, b, out);
}

#endif
