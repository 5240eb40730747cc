/*
 * oom_inject — an allocation-failure countdown over this program's
 * malloc/calloc/realloc (the libraries' allocations included), for the
 * out-of-memory tests. Include it from exactly one .c file of a test program.
 *
 *   countdown  -1: off; k >= 0: k more allocations succeed, then every one fails
 *   live       heap blocks handed out minus blocks freed (a leak check around a call)
 *
 * Interposing malloc conflicts with the sanitizers' own, so under ASan or TSan
 * OOM_SKIP is defined, nothing is interposed and SKIP_UNDER_SANITIZER() skips.
 */
#ifndef ECT_OOM_INJECT_H
#define ECT_OOM_INJECT_H

#include <stdlib.h>

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define OOM_SKIP 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define OOM_SKIP 1
#endif
#endif

static int countdown = -1;
static long live;

#ifndef OOM_SKIP
extern void *__libc_malloc(size_t n);
extern void *__libc_calloc(size_t n, size_t m);
extern void *__libc_realloc(void *p, size_t n);
extern void __libc_free(void *p);

static int fail_now(void) {
    if (countdown < 0) return 0;
    if (countdown == 0) return 1;
    countdown--;
    return 0;
}

void *malloc(size_t n) {
    if (fail_now()) return NULL;
    void *p = __libc_malloc(n);
    if (p) live++;
    return p;
}

void *calloc(size_t n, size_t m) {
    if (fail_now()) return NULL;
    void *p = __libc_calloc(n, m);
    if (p) live++;
    return p;
}

void *realloc(void *old, size_t n) {
    if (fail_now()) return NULL;
    void *p = __libc_realloc(old, n);
    if (p && !old) live++;
    return p;
}

void free(void *p) {
    if (p) live--;
    __libc_free(p);
}
#define SKIP_UNDER_SANITIZER()                                                                     \
    do {                                                                                           \
    } while (0)
#else
#define SKIP_UNDER_SANITIZER() skip()
#endif

#endif
