/* cmd_info — `ect info`: version, what was compiled in, the defaults. */
#include <errno.h>
#include <getopt.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "cli/cli.h"
#include "ect_config.h"
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

static void help(void) {
    printf("usage: ect info\n\n"
           "Prints the library version, the build, the transports compiled in (each tried\n"
           "with a 1-byte loopback write: 'works' or why it fails) and the\n"
           "protocol defaults.\n");
}

int cmd_info(int argc, char **argv) {
    static const struct option opts[] = {{"help", no_argument, 0, 'h'}, {0, 0, 0, 0}};
    int c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        if (c == 'h') {
            help();
            return CLI_EXIT_OK;
        }
        return cli_usage_error("info", "unknown flag");
    }
    if (optind < argc) return cli_usage_error("info", "unexpected argument '%s'", argv[optind]);
    printf("ectransfer %s\n", ect_version());
    printf("build: %s%s%s\n", ECT_BUILD_TYPE, ECT_SANITIZE_MODE[0] ? ", sanitize=" : "",
           ECT_SANITIZE_MODE);
    printf("transports compiled in: tcp shm%s\n", ECT_HAVE_UCX ? " ucx" : "");
    static const char *const kinds[] = {"tcp", "shm", "ucx"};
    for (size_t k = 0; k < sizeof kinds / sizeof kinds[0]; k++) {
        if (k == 2 && !ECT_HAVE_UCX) break;
        char why[200];
        printf("  %-4s %s\n", kinds[k], probe_transport(kinds[k], why, sizeof why) ? "works" : why);
    }
    printf("defaults:\n");
    printf("  ec_ip                127.0.0.1\n");
    printf("  ec_port              14579 (pull: ROUTER +0, PUB +1; push: + dp_index*tp_size + "
           "tp_rank)\n");
    printf("  ec_buffer_size       1000000000 bytes\n");
    printf("  alignment            256 B\n");
    printf("  reservation ttl      300 s (refresh after 150 s, reaper every 1 s)\n");
    printf("  control timeout      30 s; push wait 60 s; pull receive timeout 60 s\n");
    printf("  event backlog        4096; tombstones 65536\n");
    return CLI_EXIT_OK;
}
