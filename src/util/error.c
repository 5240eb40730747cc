/*
 * error — the error enum's sentences and the thread-local detail string that
 * ect_last_error() returns. A failing call overwrites the detail; a
 * succeeding call leaves it alone, so callers read it right after a failure.
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "util/util.h"

#define ECT_ERRBUF ECT_ERROR_LEN

static _Thread_local char last_error[ECT_ERRBUF];

const char *ect_strerror(int err) {
    switch (err) {
    case ECT_OK: return "success";
    case ECT_EINVAL: return "invalid argument";
    case ECT_ENOMEM: return "out of memory";
    case ECT_EFULL: return "pool is full";
    case ECT_ENOTFOUND: return "not found";
    case ECT_EPROTO: return "protocol error";
    case ECT_ETIMEDOUT: return "timed out";
    case ECT_EIO: return "I/O error";
    case ECT_ECONNREFUSED: return "peer unreachable";
    case ECT_ECLOSED: return "closed";
    case ECT_EBUSY: return "resource busy";
    case ECT_EEXIST: return "already exists";
    case ECT_ERANGE: return "out of range";
    case ECT_EACCES: return "permission denied";
    case ECT_ENOTSUP: return "not supported";
    case ECT_ECANCELED: return "cancelled";
    case ECT_ESTATE: return "illegal in the current state";
    case ECT_EOVERFLOW: return "size overflow";
    default: return "unknown error";
    }
}

const char *ect_last_error(void) { return last_error; }

void ect_clear_error(void) { last_error[0] = '\0'; }

/* Formats into a scratch buffer first, so the detail may quote the previous
 * one ("...: %s", ect_last_error()) without reading what it overwrites. */
int ect_set_error(int code, const char *fmt, ...) {
    char tmp[ECT_ERRBUF];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    memcpy(last_error, tmp, sizeof tmp);
    return code;
}

static int errno_to_code(int e) {
    switch (e) {
    case ENOMEM: return ECT_ENOMEM;
    case ECONNREFUSED:
    case EHOSTUNREACH:
    case ENETUNREACH:
    case ECONNRESET:
    case EPIPE: return ECT_ECONNREFUSED;
    case ETIMEDOUT:
    case EAGAIN: return ECT_ETIMEDOUT;
    case EACCES:
    case EPERM: return ECT_EACCES;
    case ENOENT: return ECT_ENOTFOUND;
    case EEXIST:
    case EADDRINUSE: return ECT_EEXIST;
    case EINVAL: return ECT_EINVAL;
    case ENOSYS:
    case EOPNOTSUPP: return ECT_ENOTSUP;
    default: return ECT_EIO;
    }
}

int ect_set_errno(int e, const char *fmt, ...) {
    char what[ECT_ERRBUF / 2];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    snprintf(last_error, sizeof last_error, "%s: %s", what, strerror(e));
    return errno_to_code(e);
}
