/* testutil — see testutil.h. */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include <zmq.h>

#include "testutil.h"
#include "push/control_client.h"
#include "util/util.h"

void test_assert_err(int rc, int expected, const char *msg_part, const char *file, int line) {
    if (rc != expected) {
        print_error("%s:%d: expected %d (%s), got %d (%s); last error: %s\n", file, line, expected,
                    ect_strerror(expected), rc, ect_strerror(rc), ect_last_error());
        _fail(file, line);
    }
    if (msg_part && !strstr(ect_last_error(), msg_part)) {
        print_error("%s:%d: error text '%s' does not mention '%s'\n", file, line, ect_last_error(),
                    msg_part);
        _fail(file, line);
    }
}

uint64_t test_rand(uint64_t *state) {
    uint64_t z = (*state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

void test_fill_pattern(void *buf, size_t n, uint64_t seed) {
    unsigned char *p = buf;
    uint64_t st = seed, v = 0;
    for (size_t i = 0; i < n; i++) {
        if ((i & 7) == 0) v = test_rand(&st);
        p[i] = (unsigned char)(v >> ((i & 7) * 8));
    }
}

int test_check_pattern(const void *buf, size_t n, uint64_t seed) {
    const unsigned char *p = buf;
    uint64_t st = seed, v = 0;
    for (size_t i = 0; i < n; i++) {
        if ((i & 7) == 0) v = test_rand(&st);
        if (p[i] != (unsigned char)(v >> ((i & 7) * 8))) return 0;
    }
    return 1;
}

const char *test_protocol_md(void) {
    char path[1024];
    const char *src = getenv("ECT_SOURCE_DIR");
    if (src) {
        snprintf(path, sizeof path, "%s/docs/PROTOCOL.md", src);
    } else { /* run by hand: find the docs from this file's path */
        snprintf(path, sizeof path, "%s", __FILE__);
        char *cut = strstr(path, "tests/unit/");
        assert_non_null(cut);
        snprintf(cut, sizeof path - (size_t)(cut - path), "docs/PROTOCOL.md");
    }
    FILE *f = fopen(path, "rb");
    if (!f) fail_msg("cannot open %s", path);
    static char doc[256 * 1024];
    size_t n = fread(doc, 1, sizeof doc - 1, f);
    fclose(f);
    doc[n] = '\0';
    return doc;
}

void test_accept_key(const char *dir, const char *name, const char *from) {
    char src[512], dst[512], buf[64];
    snprintf(src, sizeof src, "%s/self.public", from);
    snprintf(dst, sizeof dst, "%s/accept/%s.public", dir, name);
    FILE *f = fopen(src, "r");
    assert_non_null(f);
    size_t n = fread(buf, 1, sizeof buf, f);
    fclose(f);
    f = fopen(dst, "w");
    assert_non_null(f);
    assert_int_equal(fwrite(buf, 1, n, f), n);
    fclose(f);
}

void test_nap_ms(int ms) {
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

int test_threads_named(const char *name) {
    DIR *d = opendir("/proc/self/task");
    assert_non_null(d);
    int n = 0;
    for (struct dirent *de; (de = readdir(d));) {
        if (de->d_name[0] == '.') continue;
        char path[300], comm[32] = "";
        snprintf(path, sizeof path, "/proc/self/task/%s/comm", de->d_name);
        FILE *f = fopen(path, "r");
        if (!f) continue; /* the thread ended meanwhile */
        if (fgets(comm, sizeof comm, f)) comm[strcspn(comm, "\n")] = 0;
        fclose(f);
        n += strcmp(comm, name) == 0;
    }
    closedir(d);
    return n;
}

void test_inst_open(test_inst *in, int tp, const ect_push_consumer_opts *tmpl) {
    assert_true(tp >= 1 && tp <= TEST_MAXTP);
    memset(in, 0, sizeof *in);
    in->tp = tp;
    uint64_t seed = (uint64_t)getpid() * 7919u + (uint64_t)ect_now_ns();
    for (int attempt = 0; attempt < 50; attempt++) {
        int base = 20000 + (int)(test_rand(&seed) % 30000);
        int ok = 1;
        for (int r = 0; r < tp && ok; r++) {
            ect_push_consumer_opts o = *tmpl;
            o.ec_port = base;
            o.tp_size = tp;
            o.tp_rank = r;
            int rc = ect_push_consumer_open(&o, &in->c[r]);
            if (rc == ECT_EEXIST) {
                ok = 0;
                break;
            }
            assert_int_equal(rc, 0);
            assert_int_equal(ect_push_consumer_port(in->c[r]), base + r);
        }
        if (ok) {
            in->base = base;
            return;
        }
        for (int r = 0; r < tp; r++) {
            ect_push_consumer_close(in->c[r]);
            in->c[r] = NULL;
        }
    }
    fail_msg("no free port range");
}

void test_inst_close_checked(test_inst *in) {
    for (int r = 0; r < in->tp; r++) {
        ect_push_consumer_evict(in->c[r], SIZE_MAX);
        ect_push_consumer_drop_spares(in->c[r]);
        ect_push_consumer_stat st;
        ect_push_consumer_stats(in->c[r], &st);
        assert_int_equal(st.spares, 0);
        assert_int_equal(st.pool_used, 0);
        assert_int_equal(st.live, 0);
        ect_push_consumer_close(in->c[r]);
    }
}

void test_prod_open(test_prod *p, int base, const char *transport, int ctl_timeout_ms) {
    memset(p, 0, sizeof *p);
    p->zctx = zmq_ctx_new();
    assert_int_equal(ctl_client_open(p->zctx, ctl_timeout_ms, &p->cli), 0);
    assert_int_equal(ect_xport_open(transport, NULL, &p->xp), 0);
    assert_int_equal(ctl_peers(p->cli, "127.0.0.1", base, p->ports, TEST_MAXTP, &p->n), 0);
}

void test_prod_close(test_prod *p) {
    ctl_client_close(p->cli);
    ect_xport_close(p->xp);
    zmq_ctx_term(p->zctx);
}

void test_region_open(ect_xport *x, size_t len, test_region *r) {
    r->len = len;
    r->fd = memfd_create("ect-test-region", MFD_CLOEXEC);
    assert_true(r->fd >= 0);
    assert_int_equal(ftruncate(r->fd, (off_t)len), 0);
    r->addr = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, r->fd, 0);
    assert_true(r->addr != MAP_FAILED);
    if (ect_xport_register(x, r->addr, len, r->fd, 0, r->key) != 0)
        fail_msg("register: %s", ect_last_error());
}

void test_region_close(ect_xport *x, test_region *r) {
    if (x) assert_int_equal(ect_xport_unregister(x, r->key), 0);
    munmap(r->addr, r->len);
    close(r->fd);
}
