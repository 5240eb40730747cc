/* cmd_info — `ect info`: version, what was compiled in, the defaults. */
#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <getopt.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include <jansson.h>

#include "cli/cli.h"
#include "ectransfer.h"

/* Opens a target and an initiator of `kind`, writes 1 byte over loopback into
 * a memfd region and reads it back. On failure why gets "fails: ...". */
static bool probe_transport(const char *kind, char *why, size_t cap) {
    ect_xport *t = NULL, *i = NULL;
    ect_xport_opts o;
    ect_xport_opts_init(&o);
    o.connect_timeout_ms = 2000;
    o.io_timeout_ms = 5000;
    int fd = -1;
    uint8_t *mem = MAP_FAILED;
    char key[ECT_XPORT_KEY_MAX];
    const uint8_t b = 0x5a;
    why[0] = '\0';
    if (ect_xport_open(kind, &o, &t) != 0 || ect_xport_open(kind, &o, &i) != 0) {
        snprintf(why, cap, "fails: %s", ect_last_error());
    } else if ((fd = memfd_create("ect-info", MFD_CLOEXEC)) < 0 || ftruncate(fd, 4096) != 0 ||
               (mem = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0)) == MAP_FAILED) {
        snprintf(why, cap, "fails: memfd: %s", strerror(errno));
    } else if (ect_xport_register(t, mem, 4096, fd, 0, key) != 0) {
        snprintf(why, cap, "fails: %s", ect_last_error());
    } else {
        ect_write w = {
            .src = &b, .dst_addr = (uint64_t)(uintptr_t)(mem + 100), .len = 1, .dst_key = key};
        if (ect_xport_write_batch(i, ect_xport_session(t), &w, 1, NULL) != 0)
            snprintf(why, cap, "fails: %s", ect_last_error());
        else if (mem[100] != b)
            snprintf(why, cap, "fails: the byte did not land");
    }
    ect_xport_close(i);
    ect_xport_close(t);
    if (mem != MAP_FAILED) munmap(mem, 4096);
    if (fd >= 0) close(fd);
    return why[0] == '\0';
}

/* Prints the defaults as each options struct's _init fills them (so they
 * cannot drift from the library), grouped by role. */
static void print_defaults(void) {
    char b[32];
    ect_pool_opts po;
    ect_pool_opts_init(&po);
    ect_xport_opts xo;
    ect_xport_opts_init(&xo);
    ect_push_consumer_opts co;
    ect_push_consumer_opts_init(&co);
    ect_push_scheduler_opts so;
    ect_push_scheduler_opts_init(&so);
    ect_push_producer_opts pp;
    ect_push_producer_opts_init(&pp);
    ect_pull_producer_opts lp;
    ect_pull_producer_opts_init(&lp);
    ect_pull_consumer_opts lc;
    ect_pull_consumer_opts_init(&lc);
    ect_pull_scheduler_opts ls;
    ect_pull_scheduler_opts_init(&ls);
    printf("defaults (from the library's _opts_init):\n");
    printf("  pool (ect_pool_opts)          capacity %" PRIu64 " B (%s), alignment %" PRIu64
           " B, memfd %d, huge_pages %d, mlock %d\n",
           po.capacity, cli_fmt_size(po.capacity, b, sizeof b), po.alignment, po.use_memfd,
           po.huge_pages, po.mlock);
    printf("  data plane (ect_xport_opts)   listen %s, conns_per_peer %d, stripe_min %" PRIu64
           " B, connect %d ms, io %d ms\n",
           xo.listen ? xo.listen : "(none)", xo.conns_per_peer, xo.stripe_min,
           xo.connect_timeout_ms, xo.io_timeout_ms);
    printf("  push consumer                 ec_ip %s, ec_port %d (+ dp_index x tp_size + tp_rank),"
           " tp_size %d, pool %" PRIu64 " B, transport %s,\n"
           "                                ttl %" PRIu64 " ms, pending grace %" PRIu64
           " ms, reaper %d ms, events %zu, tombstones %zu, pool device %s\n",
           co.ec_ip ? co.ec_ip : "(none)", co.ec_port, co.tp_size, co.pool_size,
           co.transport ? co.transport : "tcp", co.ttl_ms, co.pending_grace_ms, co.reap_interval_ms,
           co.max_events, co.max_tombstones, co.pool_device ? co.pool_device : "cpu");
    printf("  push scheduler                consumer %s:%d, push wait %" PRIu64 " ms, ttl %" PRIu64
           " ms, control timeout %.0f s, cancel attempts %u, drain %" PRIu64 " ms\n",
           so.consumer_host ? so.consumer_host : "(none)", so.consumer_port, so.push_wait_ms,
           so.ttl_ms, so.control_timeout_s, so.cancel_attempts, so.min_drain_interval_ms);
    printf("  push producer                 staging %" PRIu64
           " B (%s), control %d ms, refresh after %" PRIu64 " ms, input wait %" PRIu64
           " ms, ttl %" PRIu64 " ms,\n"
           "                                connect %d ms, io %d ms, listen host %s,\n"
           "                                push wait %" PRIu64 " ms (a full consumer pool is "
           "waited out), staging wait %" PRIu64 " ms, expect shards %u (0: any)\n",
           pp.staging_size, cli_fmt_size(pp.staging_size, b, sizeof b), pp.control_timeout_ms,
           pp.refresh_after_ms, pp.input_wait_ms, pp.ttl_ms, pp.connect_timeout_ms,
           pp.io_timeout_ms, pp.listen_host ? pp.listen_host : "(none)", pp.push_wait_ms,
           pp.staging_wait_ms, pp.expect_shards);
    printf("  pull producer                 host %s, port %d (ROUTER; PUB +1), transport %s, pool "
           "%" PRIu64 " B, alignment %" PRIu64 " B,\n"
           "                                connect %d ms, io %d ms, lanes %u (%u per peer), page "
           "%u items\n",
           lp.host ? lp.host : "(none)", lp.port, lp.transport ? lp.transport : "tcp", lp.pool_size,
           lp.alignment, lp.connect_timeout_ms, lp.io_timeout_ms, lp.max_lanes,
           lp.max_lanes_per_peer, lp.page_items);
    printf("  pull consumer                 transport %s, pool %" PRIu64 " B, alignment %" PRIu64
           " B, timeout %d ms, quarantine %d ms\n",
           lc.transport ? lc.transport : "tcp", lc.pool_size, lc.alignment, lc.timeout_ms,
           lc.quarantine_ms);
    printf("  pull scheduler                request retry %d ms\n", ls.request_retry_ms);
    const char *lvl = getenv("ECT_LOG"), *tls = getenv("UCX_TLS");
    printf("environment: ECT_LOG=%s (error|warn|info|debug), UCX_TLS=%s\n",
           lvl ? lvl : "(unset: warn)", tls ? tls : "(unset: UCX picks)");
}

/* `ect info --json`: one compact JSON object with the same facts. */
static int print_json(void) {
    json_t *o = json_object(), *tr = json_object(), *cu = json_object(), *def = json_object();
    json_object_set_new(o, "version", json_string(ect_version()));
    json_object_set_new(o, "abi_version", json_integer(ect_abi_version()));
    json_object_set_new(o, "build_type", json_string(ect_build_info("build_type")));
    json_object_set_new(o, "sanitize", json_string(ect_build_info("sanitize")));
    static const char *const kinds[] = {"tcp", "shm", "ucx"};
    for (size_t k = 0; k < sizeof kinds / sizeof kinds[0]; k++) {
        if (k == 2 && !cli_have_transport("ucx")) break;
        char why[200];
        /* the status word: "ok", or the error text */
        bool ok = probe_transport(kinds[k], why, sizeof why);
        json_object_set_new(tr, kinds[k], json_string(ok ? "ok" : why));
    }
    json_object_set_new(o, "transports", tr);
    ect_cuda_info ci;
    if (ect_cuda_get_info(&ci) == 0) {
        json_object_set_new(cu, "status", json_string("ok"));
        json_object_set_new(cu, "driver_version", json_integer(ci.driver_version));
        json_object_set_new(cu, "library", json_string(ci.library));
        json_object_set_new(cu, "devices", json_integer(ci.devices));
        json_object_set_new(cu, "device0", json_string(ci.device0));
    } else {
        json_object_set_new(cu, "status", json_string(ci.why));
    }
    json_object_set_new(o, "cuda", cu);
    ect_push_consumer_opts co;
    ect_push_consumer_opts_init(&co);
    json_t *pc = json_object();
    json_object_set_new(pc, "ec_ip", json_string(co.ec_ip ? co.ec_ip : ""));
    json_object_set_new(pc, "ec_port", json_integer(co.ec_port));
    json_object_set_new(pc, "pool_size", json_integer((json_int_t)co.pool_size));
    json_object_set_new(pc, "transport", json_string(co.transport ? co.transport : "tcp"));
    json_object_set_new(pc, "ttl_ms", json_integer((json_int_t)co.ttl_ms));
    json_object_set_new(pc, "data_port", json_integer(co.data_port));
    json_object_set_new(def, "push_consumer", pc);
    ect_pull_producer_opts lp;
    ect_pull_producer_opts_init(&lp);
    json_t *pp = json_object();
    json_object_set_new(pp, "host", json_string(lp.host ? lp.host : ""));
    json_object_set_new(pp, "port", json_integer(lp.port));
    json_object_set_new(pp, "pool_size", json_integer((json_int_t)lp.pool_size));
    json_object_set_new(pp, "transport", json_string(lp.transport ? lp.transport : "tcp"));
    json_object_set_new(def, "pull_producer", pp);
    json_object_set_new(o, "defaults", def);
    char *txt = json_dumps(o, JSON_COMPACT | JSON_PRESERVE_ORDER);
    json_decref(o);
    if (!txt) return CLI_EXIT_FAIL;
    printf("%s\n", txt);
    free(txt);
    return CLI_EXIT_OK;
}

static void help(void) {
    printf("usage: ect info [--json]\n\n"
           "Prints the library version, the build, the transports compiled in (each tried\n"
           "with a 1-byte loopback write: 'works' or why it fails), whether CUDA is\n"
           "available (the driver, libcuda.so.1 or $ECT_CUDA_LIBRARY, is loaded at run time;\n"
           "if it is not, why) and the protocol defaults.\n"
           "  --json   one compact JSON object: version, abi_version, build_type, sanitize,\n"
           "           transports {NAME: \"ok\" or why it fails}, cuda {status: \"ok\" or why,\n"
           "           ...}, defaults {push_consumer, pull_producer}\n");
}

int cmd_info(int argc, char **argv) {
    static const struct option opts[] = {
        {"help", no_argument, 0, 'h'}, {"json", no_argument, 0, 'j'}, {0, 0, 0, 0}};
    int c;
    bool json = false;
    optind = 1;
    opterr = 0;
    while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        if (c == 'h') {
            help();
            return CLI_EXIT_OK;
        }
        if (c == 'j') {
            json = true;
            continue;
        }
        return cli_usage_error("info", "unknown flag '%s'; accepted: --json, --help",
                               argv[optind - 1]);
    }
    if (optind < argc) return cli_usage_error("info", "unexpected argument '%s'", argv[optind]);
    if (json) return print_json();
    printf("ectransfer %s\n", ect_version());
    const char *san = ect_build_info("sanitize");
    printf("build: %s%s%s\n", ect_build_info("build_type"), san[0] ? ", sanitize=" : "", san);
    printf("transports compiled in: %s\n", ect_build_info("transports"));
    static const char *const kinds[] = {"tcp", "shm", "ucx"};
    for (size_t k = 0; k < sizeof kinds / sizeof kinds[0]; k++) {
        if (k == 2 && !cli_have_transport("ucx")) break;
        char why[200];
        printf("  %-4s %s\n", kinds[k], probe_transport(kinds[k], why, sizeof why) ? "works" : why);
    }
    ect_cuda_info ci;
    if (ect_cuda_get_info(&ci) == 0)
        printf("cuda: available: driver %d.%d (%s), %d device%s, device 0: %s\n",
               ci.driver_version / 1000, ci.driver_version % 1000 / 10, ci.library, ci.devices,
               ci.devices == 1 ? "" : "s", ci.device0);
    else
        printf("cuda: unavailable: %s\n"
               "      (GPU memory kinds fail with this reason: --pool-device cuda|pinned,\n"
               "      --device cuda; set ECT_CUDA_LIBRARY to use another driver library)\n",
               ci.why);
    print_defaults();
    return CLI_EXIT_OK;
}
